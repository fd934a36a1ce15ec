"""Web pages (the REST API lives under api/v1/, see api_urls.py)."""

from django.urls import include, path

from training.views import compare, dry_runs, exports, models, plotly, runs, secrets, trajectories

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
    # Before the catch-all run action below: analytics pages hang under runs/<id>/ too.
    path("", include("training.analytics.urls")),
    path("runs/<int:run_id>/<slug:action>/", runs.run_action_view, name="run-action"),
    path("compare/", compare.run_compare_view, name="run-compare"),
    path("models/", models.model_list_view, name="model-list"),
    path("models/judges/", models.judge_create_view, name="judge-create"),
    path("models/judges/<int:endpoint_id>/delete/", models.judge_delete_view, name="judge-delete"),
    path("secrets/", secrets.secret_list_view, name="secret-list"),
    path("secrets/<int:secret_id>/delete/", secrets.secret_delete_view, name="secret-delete"),
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
