from django.contrib import admin
from django.urls import include, path

from artweb.views import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include("artweb.api_urls")),
    path("", include("training.urls")),
]
