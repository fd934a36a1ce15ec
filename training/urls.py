"""Web pages (the REST API lives under api/v1/, see api_urls.py)."""

from django.urls import path

from training.views import compare, dry_runs, exports, models, plotly, rescores, runs, trajectories
from training.views.health import run_reward_health_view
from training.views.heatmap import run_heatmap_view
from training.views.playground import diff_detail_view, diff_list_view, playground_view

urlpatterns = [
    path("", runs.run_list_view, name="run-list"),
    path("runs/new/", runs.run_launch_view, name="run-launch"),
    path("runs/<int:run_id>/", runs.run_detail_view, name="run-detail"),
    path("runs/<int:run_id>/trajectories/", trajectories.trajectory_inspector_view, name="run-trajectories"),
    path(
        "runs/<int:run_id>/checkpoints/<int:checkpoint_id>/download/",
        runs.checkpoint_download_view,
        name="checkpoint-download",
    ),
    path("runs/<int:run_id>/alerts/", runs.run_alerts_view, name="run-alerts"),
    path("runs/<int:run_id>/health/", run_reward_health_view, name="run-reward-health"),
    path("runs/<int:run_id>/heatmap/", run_heatmap_view, name="run-heatmap"),
    path("runs/<int:run_id>/rescores/", rescores.run_rescores_view, name="run-rescores"),
    path("rescores/<int:rescore_id>/", rescores.rescore_detail_view, name="rescore-detail"),
    path("runs/<int:run_id>/<slug:action>/", runs.run_action_view, name="run-action"),
    path("compare/", compare.run_compare_view, name="run-compare"),
    path("playground/", playground_view, name="playground"),
    path("playground/<int:job_id>/", playground_view, name="playground-session"),
    path("diffs/", diff_list_view, name="diff-list"),
    path("diffs/<int:job_id>/", diff_detail_view, name="diff-detail"),
    path("models/", models.model_list_view, name="model-list"),
    path("models/judges/", models.judge_create_view, name="judge-create"),
    path("models/judges/<int:endpoint_id>/delete/", models.judge_delete_view, name="judge-delete"),
    path("exports/", exports.export_list_view, name="export-list"),
    path("exports/new/<slug:kind>/", exports.export_create_view, name="export-new"),
    path("exports/<int:target_id>/", exports.export_detail_view, name="export-detail"),
    path("exports/<int:target_id>/test/", exports.export_test_view, name="export-test"),
    path("exports/<int:target_id>/delete/", exports.export_delete_view, name="export-delete"),
    path("dry-runs/new/", dry_runs.dry_run_create_view, name="dry-run-new"),
    path("dry-runs/<int:dry_run_id>/", dry_runs.dry_run_detail_view, name="dry-run-detail"),
    path("dry-runs/<int:dry_run_id>/status/", dry_runs.dry_run_status_view, name="dry-run-status"),
    path("assets/plotly-<str:version>.min.js", plotly.plotly_js, name="plotly-js"),
]
