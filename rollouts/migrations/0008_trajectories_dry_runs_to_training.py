"""TrajectoryGroup, Trajectory and DryRun now belong to training (training 0010 takes them over with their
tables): they leave rollouts' state only, and nothing in the database changes."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("rollouts", "0007_reward_timing_truncated_dry_run_samples"),
        ("training", "0010_trajectories_dry_runs_from_rollouts"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.DeleteModel(name="DryRun"),
                migrations.DeleteModel(name="Trajectory"),
                migrations.DeleteModel(name="TrajectoryGroup"),
            ],
        ),
    ]
