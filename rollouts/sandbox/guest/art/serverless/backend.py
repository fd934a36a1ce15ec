"""`art.serverless.backend` (artweb_sdk.model.ServerlessBackend)."""

from artweb_sdk.model import ServerlessBackend  # noqa: F401
