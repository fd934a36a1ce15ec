"""`art.backend` (artweb_sdk.model.Backend)."""

from artweb_sdk.model import Backend  # noqa: F401
