"""/api/v1/art/: ART's ServerlessBackend protocol and the OpenAI endpoint beside it (training.client_runs.views).
Its protocol is ART's, so its routes stay out of the REST API's OpenAPI schema."""

from django.urls import path

from training.client_runs import views
from training.serving.apis import endpoint

urlpatterns = [
    path("preview/models", views.models_create, name="art-models"),
    path("preview/models/<str:model_id>", views.model_detail, name="art-model"),
    path("preview/models/<str:model_id>/checkpoints", views.model_checkpoints, name="art-checkpoints"),
    path("preview/models/<str:model_id>/log", views.model_log, name="art-log"),
    path("preview/training-jobs", views.training_jobs_create, name="art-training-jobs"),
    path("preview/training-jobs/<str:job_id>/events", views.training_job_events, name="art-training-job-events"),
    path("preview/sft-training-jobs", views.sft_jobs_create, name="art-sft-jobs"),
    path("chat/completions", views.chat_completions, name="art-chat"),
    path("models", endpoint.models_list, name="art-openai-models"),
]
