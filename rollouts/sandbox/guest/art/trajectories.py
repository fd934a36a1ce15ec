"""`art.trajectories` (artweb_sdk.trajectory)."""

from artweb_sdk.trajectory import History, Trajectory, TrajectoryGroup  # noqa: F401
