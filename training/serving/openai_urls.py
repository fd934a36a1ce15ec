"""/api/v1/openai/: the OpenAI-compatible endpoint (training.serving.apis.endpoint). Its protocol is OpenAI's,
so its routes stay out of the REST API's OpenAPI schema (artweb/api_urls.py includes them beside it)."""

from django.urls import path

from training.serving.apis import endpoint

urlpatterns = [
    path("chat/completions", endpoint.chat_completions, name="api-openai-chat"),
    path("models", endpoint.models_list, name="api-openai-models"),
]
