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
    rescores,
    runs,
    tokens,
    trajectories,
)
from training.apis import serve_jobs as serve_jobs_api
from training.apis import serving as serving_api
from training.apis.health import RunRewardHealthApi
from training.apis.heatmap import RunHeatmapApi

urlpatterns = [
    path(
        "checkpoints/<int:checkpoint_id>/alias/", serving_api.CheckpointAliasApi.as_view(), name="api-checkpoint-alias"
    ),
    path("playground/create/", serve_jobs_api.PlaygroundCreateApi.as_view(), name="api-playground-create"),
    path("playground/<int:job_id>/", serve_jobs_api.PlaygroundDetailApi.as_view(), name="api-playground"),
    path("diffs/", serve_jobs_api.DiffListApi.as_view(), name="api-diffs"),
    path("diffs/create/", serve_jobs_api.DiffCreateApi.as_view(), name="api-diff-create"),
    path("diffs/<int:job_id>/", serve_jobs_api.DiffDetailApi.as_view(), name="api-diff"),
    path("diffs/<int:job_id>/scenarios/", serve_jobs_api.DiffScenarioListApi.as_view(), name="api-diff-scenarios"),
    path("diffs/<int:job_id>/export/", serve_jobs_api.DiffExportApi.as_view(), name="api-diff-export"),
    path(
        "checkpoints/<int:checkpoint_id>/alias/delete/",
        serving_api.CheckpointAliasDeleteApi.as_view(),
        name="api-checkpoint-alias-delete",
    ),
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
    path("runs/<int:run_id>/reward-health/", RunRewardHealthApi.as_view(), name="api-run-reward-health"),
    path("runs/<int:run_id>/heatmap/", RunHeatmapApi.as_view(), name="api-run-heatmap"),
    path("runs/<int:run_id>/events/", runs.RunEventListApi.as_view(), name="api-run-events"),
    path("runs/<int:run_id>/rescores/", rescores.RunRescoreListApi.as_view(), name="api-run-rescores"),
    path("rescores/<int:rescore_id>/", rescores.RescoreDetailApi.as_view(), name="api-rescore"),
    path("rescores/<int:rescore_id>/scores/", rescores.RescoreScoreListApi.as_view(), name="api-rescore-scores"),
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
