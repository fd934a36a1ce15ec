"""`art.auto_trajectory` (artweb_sdk.capture)."""

from artweb_sdk.capture import auto_trajectory, capture_auto_trajectory  # noqa: F401
