"""`art.utils.limit_concurrency` (artweb_sdk.utils)."""

from artweb_sdk.utils import limit_concurrency  # noqa: F401
