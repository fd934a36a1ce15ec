"""/api/v1/ routes for a run's reward health, heatmap and re-scores."""

from django.urls import path

from training.analytics.apis import heatmap, rescores, reward_health

urlpatterns = [
    path(
        "runs/<int:run_id>/reward-health/",
        reward_health.RunRewardHealthApi.as_view(),
        name="api-run-reward-health",
    ),
    path("runs/<int:run_id>/heatmap/", heatmap.RunHeatmapApi.as_view(), name="api-run-heatmap"),
    path("runs/<int:run_id>/rescores/", rescores.RunRescoreListApi.as_view(), name="api-run-rescores"),
    path("rescores/<int:rescore_id>/", rescores.RescoreDetailApi.as_view(), name="api-rescore"),
    path("rescores/<int:rescore_id>/scores/", rescores.RescoreScoreListApi.as_view(), name="api-rescore-scores"),
]
