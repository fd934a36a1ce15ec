"""Pages for uploads (included from artweb/urls.py)."""

from django.urls import path

from rollouts import views

urlpatterns = [
    path("scripts/", views.asset_list_view, {"kind": "script"}, name="script-list"),
    path("scripts/new/", views.asset_create_view, {"kind": "script"}, name="script-new"),
    path("scripts/<int:asset_id>/", views.asset_detail_view, {"kind": "script"}, name="script-detail"),
    path("scripts/<int:asset_id>/companion/", views.script_companion_view, name="script-companion"),
    path("rewards/", views.asset_list_view, {"kind": "reward"}, name="reward-list"),
    path("rewards/new/", views.asset_create_view, {"kind": "reward"}, name="reward-new"),
    path("rewards/<int:asset_id>/", views.asset_detail_view, {"kind": "reward"}, name="reward-detail"),
    path("attachments/", views.attachment_list_view, name="attachment-list"),
    path("attachments/new/", views.attachment_create_view, name="attachment-new"),
    path("attachments/<int:attachment_id>/delete/", views.attachment_delete_view, name="attachment-delete"),
    path("scenarios/", views.scenario_set_list_view, name="scenario-set-list"),
    path("scenarios/new/", views.scenario_set_create_view, name="scenario-set-new"),
    path("scenarios/<int:scenario_set_id>/", views.scenario_set_detail_view, name="scenario-set-detail"),
]
