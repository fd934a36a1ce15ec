"""`art.utils.retry` (artweb_sdk.utils)."""

from artweb_sdk.utils import retry  # noqa: F401
