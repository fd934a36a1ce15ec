"""/api/v1/ routes of the serving app: checkpoint aliases, playground sessions and answer diffs (the
OpenAI-compatible endpoint has its own, openai_urls.py)."""

from django.urls import path

from training.serving.apis import aliases, serve_jobs

urlpatterns = [
    path("checkpoints/<int:checkpoint_id>/alias/", aliases.CheckpointAliasApi.as_view(), name="api-checkpoint-alias"),
    path(
        "checkpoints/<int:checkpoint_id>/alias/delete/",
        aliases.CheckpointAliasDeleteApi.as_view(),
        name="api-checkpoint-alias-delete",
    ),
    path("playground/create/", serve_jobs.PlaygroundCreateApi.as_view(), name="api-playground-create"),
    path("playground/<int:job_id>/", serve_jobs.PlaygroundDetailApi.as_view(), name="api-playground"),
    path("diffs/", serve_jobs.DiffListApi.as_view(), name="api-diffs"),
    path("diffs/create/", serve_jobs.DiffCreateApi.as_view(), name="api-diff-create"),
    path("diffs/<int:job_id>/", serve_jobs.DiffDetailApi.as_view(), name="api-diff"),
    path("diffs/<int:job_id>/scenarios/", serve_jobs.DiffScenarioListApi.as_view(), name="api-diff-scenarios"),
    path("diffs/<int:job_id>/export/", serve_jobs.DiffExportApi.as_view(), name="api-diff-export"),
]
