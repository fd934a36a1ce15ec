"""/api/v1/ routes for uploads. One view per operation; writes are POSTs to a named action."""

from django.urls import path

from rollouts.apis import attachments, code, scenarios

urlpatterns = [
    path("scripts/", code.ScriptListApi.as_view(), name="api-scripts"),
    path("scripts/create/", code.ScriptCreateApi.as_view(), name="api-script-create"),
    path("scripts/validate/", code.ScriptValidateApi.as_view(), name="api-script-validate"),
    path("scripts/<int:script_id>/", code.ScriptDetailApi.as_view(), name="api-script"),
    path("scripts/<int:script_id>/companion/", code.ScriptCompanionApi.as_view(), name="api-script-companion"),
    path("scripts/<int:script_id>/versions/", code.ScriptVersionListApi.as_view(), name="api-script-versions"),
    path(
        "scripts/<int:script_id>/versions/create/",
        code.ScriptVersionCreateApi.as_view(),
        name="api-script-version-create",
    ),
    path(
        "scripts/<int:script_id>/versions/<int:number>/",
        code.ScriptVersionDetailApi.as_view(),
        name="api-script-version",
    ),
    path("rewards/", code.RewardListApi.as_view(), name="api-rewards"),
    path("rewards/create/", code.RewardCreateApi.as_view(), name="api-reward-create"),
    path("rewards/validate/", code.RewardValidateApi.as_view(), name="api-reward-validate"),
    path("rewards/<int:reward_id>/", code.RewardDetailApi.as_view(), name="api-reward"),
    path("rewards/<int:reward_id>/versions/", code.RewardVersionListApi.as_view(), name="api-reward-versions"),
    path(
        "rewards/<int:reward_id>/versions/create/",
        code.RewardVersionCreateApi.as_view(),
        name="api-reward-version-create",
    ),
    path(
        "rewards/<int:reward_id>/versions/<int:number>/",
        code.RewardVersionDetailApi.as_view(),
        name="api-reward-version",
    ),
    path("attachments/", attachments.AttachmentListApi.as_view(), name="api-attachments"),
    path("attachments/create/", attachments.AttachmentCreateApi.as_view(), name="api-attachment-create"),
    path("attachments/<int:attachment_id>/", attachments.AttachmentDetailApi.as_view(), name="api-attachment"),
    path(
        "attachments/<int:attachment_id>/delete/",
        attachments.AttachmentDeleteApi.as_view(),
        name="api-attachment-delete",
    ),
    path("scenario-sets/", scenarios.ScenarioSetListApi.as_view(), name="api-scenario-sets"),
    path("scenario-sets/create/", scenarios.ScenarioSetCreateApi.as_view(), name="api-scenario-set-create"),
    path("scenario-sets/<int:scenario_set_id>/", scenarios.ScenarioSetDetailApi.as_view(), name="api-scenario-set"),
    path(
        "scenario-sets/<int:scenario_set_id>/scenarios/",
        scenarios.ScenarioListApi.as_view(),
        name="api-scenario-set-scenarios",
    ),
]
