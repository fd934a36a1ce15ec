"""Pages for uploads and dry runs (included from training/urls.py)."""

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
    path("scenarios/", views.scenario_set_list_view, name="scenario-set-list"),
    path("scenarios/new/", views.scenario_set_create_view, name="scenario-set-new"),
    path("scenarios/<int:scenario_set_id>/", views.scenario_set_detail_view, name="scenario-set-detail"),
    path("dry-runs/new/", views.dry_run_create_view, name="dry-run-new"),
    path("dry-runs/<int:dry_run_id>/", views.dry_run_detail_view, name="dry-run-detail"),
    path("dry-runs/<int:dry_run_id>/status/", views.dry_run_status_view, name="dry-run-status"),
]
