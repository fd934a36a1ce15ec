"""`art.serverless`: where ART keeps ServerlessBackend; in artweb a stand-in (artweb_sdk.model.Backend)."""

from .backend import ServerlessBackend  # noqa: F401
