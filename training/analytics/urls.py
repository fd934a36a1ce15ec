"""Analytics pages: a run's reward health, heatmap and re-scores."""

from django.urls import path

from training.analytics.views import heatmap, rescores, reward_health

urlpatterns = [
    path("runs/<int:run_id>/health/", reward_health.run_reward_health_view, name="run-reward-health"),
    path("runs/<int:run_id>/heatmap/", heatmap.run_heatmap_view, name="run-heatmap"),
    path("runs/<int:run_id>/rescores/", rescores.run_rescores_view, name="run-rescores"),
    path("rescores/<int:rescore_id>/", rescores.rescore_detail_view, name="rescore-detail"),
]
