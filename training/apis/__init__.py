"""The REST API for base models, runs, metrics, trajectories, checkpoints, dry runs and tokens."""
