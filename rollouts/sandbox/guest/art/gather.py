"""`art.gather` (artweb_sdk.gather)."""

from artweb_sdk.gather import gather_trajectories, gather_trajectory_groups  # noqa: F401
