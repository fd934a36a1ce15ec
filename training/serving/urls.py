"""Web pages of the serving app: the playground and answer diffs."""

from django.urls import path

from training.serving.views import diffs, playground

urlpatterns = [
    path("playground/", playground.playground_view, name="playground"),
    path("playground/<int:job_id>/", playground.playground_view, name="playground-session"),
    path("diffs/", diffs.diff_list_view, name="diff-list"),
    path("diffs/<int:job_id>/", diffs.diff_detail_view, name="diff-detail"),
]
