from django.contrib import admin
from django.urls import include, path

from artweb.views import healthz
from training.prometheus import metrics_view
from training.views.ops import scheduling_view

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    # Before the admin's own routes, which would take any admin/<app>/ path.
    path("admin/scheduling/", scheduling_view, name="admin-scheduling"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include("artweb.api_urls")),
    path("", include("training.urls")),
    path("", include("training.serving.urls")),
    path("", include("rollouts.urls")),
]
