"""The OpenAPI schema is generated from the code, valid, complete, and served with a docs page."""

import pytest
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

from rollouts import api_urls as rollout_urls
from training import api_urls as training_urls
from training.analytics import api_urls as analytics_urls
from training.serving import api_urls as serving_urls

pytestmark = pytest.mark.django_db


def test_the_schema_is_valid_and_lists_every_endpoint():
    schema = SchemaGenerator().get_schema(public=True)
    validate_schema(schema)
    paths = set(schema["paths"])
    for pattern in [
        *rollout_urls.urlpatterns,
        *training_urls.urlpatterns,
        *analytics_urls.urlpatterns,
        *serving_urls.urlpatterns,
    ]:
        route = "/api/v1/" + str(pattern.pattern).replace("<int:", "{").replace(">", "}")
        assert route in paths, route
    ops = [op for item in schema["paths"].values() for op in item.values()]
    assert all(op.get("responses") for op in ops)
    run_create = schema["paths"]["/api/v1/runs/create/"]["post"]
    assert run_create["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("RunCreateInput")
    upload = schema["paths"]["/api/v1/scripts/create/"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(upload)


def test_the_schema_and_docs_are_served(alice_api, anon_api):
    response = alice_api.get("/api/v1/schema/?format=json")
    assert response.status_code == 200 and response.json()["openapi"].startswith("3.")
    docs = alice_api.get("/api/v1/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
