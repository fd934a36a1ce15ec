"""A small Python client for the artweb REST API.

    from artweb.client import Client
    api = Client("http://localhost:8000", token="...")
    version = api.script_upload("my-agent", open("rollout.py").read())
    run = api.run_create(name="first", base_model="SmolLM2-135M-Instruct", script="my-agent",
                         reward="exact-match", scenario_set="questions", config={"num_steps": 10})
    for point in api.metrics_follow(run["id"]): ...

Every method returns the decoded JSON answer; a 4xx/5xx raises ApiError with the server's message
and field errors.
"""

from __future__ import annotations

from artweb.client.exports import ExportsApi
from artweb.client.resources import ResourcesApi
from artweb.client.runs import RunsApi
from artweb.client.serving import ServingApi
from artweb.client.session import DEFAULT_TIMEOUT, ApiError

__all__ = ["DEFAULT_TIMEOUT", "ApiError", "Client"]


class Client(ResourcesApi, RunsApi, ExportsApi, ServingApi):
    """The whole API: `Client(base_url, token)`; each part (artweb.client.resources, .runs, .exports,
    .serving) holds the methods of one area."""
