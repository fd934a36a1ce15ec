"""/api/v1/ routes for models, runs, metrics, trajectories, checkpoints, dry runs, tokens, quotas and export targets.

One view per operation; writes are POSTs to a named action (HackSoft style).
"""

from django.urls import path

from training.apis import (
    base_models,
    checkpoints,
    dry_runs,
    exports,
    judges,
    quotas,
    runs,
    secrets,
    tokens,
    trajectories,
)

urlpatterns = [
    path("quota/", quotas.QuotaApi.as_view(), name="api-quota"),
    path("tokens/", tokens.TokenCreateApi.as_view(), name="api-token-create"),
    path("tokens/current/", tokens.TokenDetailApi.as_view(), name="api-token"),
    path("tokens/revoke/", tokens.TokenRevokeApi.as_view(), name="api-token-revoke"),
    path("base-models/", base_models.BaseModelListApi.as_view(), name="api-base-models"),
    path("base-models/register/", base_models.BaseModelRegisterApi.as_view(), name="api-base-model-register"),
    path("dry-runs/create/", dry_runs.DryRunCreateApi.as_view(), name="api-dry-run-create"),
    path("dry-runs/<int:dry_run_id>/", dry_runs.DryRunDetailApi.as_view(), name="api-dry-run"),
    path("runs/", runs.RunListApi.as_view(), name="api-runs"),
    path("runs/create/", runs.RunCreateApi.as_view(), name="api-run-create"),
    path("runs/<int:run_id>/", runs.RunDetailApi.as_view(), name="api-run"),
    path("runs/<int:run_id>/cancel/", runs.RunCancelApi.as_view(), name="api-run-cancel"),
    path("runs/<int:run_id>/pause/", runs.RunPauseApi.as_view(), name="api-run-pause"),
    path("runs/<int:run_id>/resume/", runs.RunResumeApi.as_view(), name="api-run-resume"),
    path("runs/<int:run_id>/retry/", runs.RunRetryApi.as_view(), name="api-run-retry"),
    path("runs/<int:run_id>/alerts/", runs.RunAlertsApi.as_view(), name="api-run-alerts"),
    path("runs/<int:run_id>/metrics/", runs.RunMetricsApi.as_view(), name="api-run-metrics"),
    path("runs/<int:run_id>/events/", runs.RunEventListApi.as_view(), name="api-run-events"),
    path("runs/<int:run_id>/logs/", runs.RunLogListApi.as_view(), name="api-run-logs"),
    path("runs/<int:run_id>/groups/", trajectories.GroupListApi.as_view(), name="api-run-groups"),
    path("runs/<int:run_id>/groups/<int:group_id>/", trajectories.GroupDetailApi.as_view(), name="api-run-group"),
    path("runs/<int:run_id>/trajectories/", trajectories.TrajectoryListApi.as_view(), name="api-run-trajectories"),
    path(
        "runs/<int:run_id>/trajectories/export/",
        trajectories.TrajectoryExportApi.as_view(),
        name="api-run-trajectories-export",
    ),
    path(
        "runs/<int:run_id>/trajectories/<int:trajectory_id>/",
        trajectories.TrajectoryDetailApi.as_view(),
        name="api-run-trajectory",
    ),
    path("runs/<int:run_id>/checkpoints/", checkpoints.CheckpointListApi.as_view(), name="api-run-checkpoints"),
    path(
        "checkpoints/<int:checkpoint_id>/download/",
        checkpoints.CheckpointDownloadApi.as_view(),
        name="api-checkpoint-download",
    ),
    path(
        "checkpoints/<int:checkpoint_id>/promote/",
        checkpoints.CheckpointPromoteApi.as_view(),
        name="api-checkpoint-promote",
    ),
    path(
        "checkpoints/<int:checkpoint_id>/delete/",
        checkpoints.CheckpointDeleteApi.as_view(),
        name="api-checkpoint-delete",
    ),
    path("judges/", judges.JudgeEndpointListApi.as_view(), name="api-judges"),
    path("judges/create/", judges.JudgeEndpointCreateApi.as_view(), name="api-judge-create"),
    path("judges/<int:endpoint_id>/", judges.JudgeEndpointDetailApi.as_view(), name="api-judge"),
    path("judges/<int:endpoint_id>/update/", judges.JudgeEndpointUpdateApi.as_view(), name="api-judge-update"),
    path("judges/<int:endpoint_id>/delete/", judges.JudgeEndpointDeleteApi.as_view(), name="api-judge-delete"),
    path("secrets/", secrets.SecretListApi.as_view(), name="api-secrets"),
    path("secrets/set/", secrets.SecretSetApi.as_view(), name="api-secret-set"),
    path("secrets/<int:secret_id>/delete/", secrets.SecretDeleteApi.as_view(), name="api-secret-delete"),
    path("export-targets/", exports.ExportTargetListApi.as_view(), name="api-export-targets"),
    path("export-targets/kinds/", exports.ExportTargetKindListApi.as_view(), name="api-export-target-kinds"),
    path("export-targets/create/", exports.ExportTargetCreateApi.as_view(), name="api-export-target-create"),
    path("export-targets/<int:target_id>/", exports.ExportTargetDetailApi.as_view(), name="api-export-target"),
    path(
        "export-targets/<int:target_id>/update/",
        exports.ExportTargetUpdateApi.as_view(),
        name="api-export-target-update",
    ),
    path("export-targets/<int:target_id>/test/", exports.ExportTargetTestApi.as_view(), name="api-export-target-test"),
    path(
        "export-targets/<int:target_id>/delete/",
        exports.ExportTargetDeleteApi.as_view(),
        name="api-export-target-delete",
    ),
]
