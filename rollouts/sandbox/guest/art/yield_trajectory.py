"""`art.yield_trajectory` (artweb_sdk.capture)."""

from artweb_sdk.capture import capture_yielded_trajectory, yield_trajectory  # noqa: F401
