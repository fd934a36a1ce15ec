from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("", include("rollouts.api_urls")),
    path("", include("training.api_urls")),
    path("", include("training.analytics.api_urls")),
    path("", include("training.serving.api_urls")),
    path("openai/", include("training.serving.openai_urls")),
    path("art/", include("training.client_runs.urls")),
]
