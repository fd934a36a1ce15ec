"""/api/v1/openai/: the OpenAI-compatible endpoint (training.apis.serving). Its protocol is OpenAI's, so its
routes stay out of the REST API's OpenAPI schema (artweb/api_urls.py includes them beside it)."""

from django.urls import path

from training.apis import serving

urlpatterns = [
    path("chat/completions", serving.chat_completions, name="api-openai-chat"),
    path("models", serving.models_list, name="api-openai-models"),
]
