"""`art.local`: where ART keeps LocalBackend; in artweb a stand-in (artweb_sdk.model.Backend)."""

from artweb_sdk.model import LocalBackend  # noqa: F401
