"""`art.batches` (artweb_sdk.gather)."""

from artweb_sdk.gather import trajectory_group_batches  # noqa: F401
