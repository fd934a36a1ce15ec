"""TrajectoryGroup, Trajectory and DryRun move from rollouts to training, which owns runs and base models:
rollouts then holds no foreign key to training. Only Django's record of the models moves; the tables keep
their names (rollouts_trajectorygroup, rollouts_trajectory, rollouts_dryrun) and no row is copied.
rollouts 0008 removes the models from rollouts' state after this one."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MOVED = ("trajectorygroup", "trajectory", "dryrun")


def content_types_to_training(apps, schema_editor):
    """Keep the moved models' content types (and so their permissions and admin log) under the new app."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if not ContentType.objects.filter(app_label="training", model=model).exists():
            ContentType.objects.filter(app_label="rollouts", model=model).update(app_label="training")


def content_types_to_rollouts(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if not ContentType.objects.filter(app_label="rollouts", model=model).exists():
            ContentType.objects.filter(app_label="training", model=model).update(app_label="rollouts")


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("rollouts", "0007_reward_timing_truncated_dry_run_samples"),
        ("training", "0009_heatmap_column"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name="DryRun",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("scenarios", models.JSONField(help_text="The scenario objects tried.")),
                        (
                            "samples",
                            models.PositiveSmallIntegerField(
                                default=1,
                                help_text="Rollouts per scenario: with more than one, the result shows the reward's spread within each scenario, the signal GRPO trains on.",
                            ),
                        ),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("queued", "Queued"),
                                    ("running", "Running"),
                                    ("done", "Done"),
                                    ("failed", "Failed"),
                                ],
                                default="queued",
                                max_length=10,
                            ),
                        ),
                        (
                            "result",
                            models.JSONField(
                                blank=True, help_text="Trajectories with rewards, logs and errors.", null=True
                            ),
                        ),
                        ("error", models.TextField(blank=True)),
                        ("dispatched_at", models.DateTimeField(blank=True, null=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "base_model",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="+", to="training.basemodel"
                            ),
                        ),
                        (
                            "owner",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "reward_version",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="dry_runs",
                                to="rollouts.rewardfunctionversion",
                            ),
                        ),
                        (
                            "script_version",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="dry_runs",
                                to="rollouts.rolloutscriptversion",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "rollouts_dryrun",
                        "ordering": ["-created_at"],
                    },
                ),
                migrations.CreateModel(
                    name="Trajectory",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("step", models.PositiveIntegerField()),
                        ("index", models.PositiveSmallIntegerField(help_text="Position within the group.")),
                        ("messages", models.JSONField(default=list)),
                        ("tools", models.JSONField(blank=True, null=True)),
                        ("reward", models.FloatField(null=True)),
                        ("advantage", models.FloatField(null=True)),
                        ("metrics", models.JSONField(blank=True, default=dict)),
                        ("metadata", models.JSONField(blank=True, default=dict)),
                        ("logs", models.JSONField(blank=True, default=list)),
                        ("error", models.TextField(blank=True)),
                        ("prompt_tokens", models.PositiveIntegerField(default=0)),
                        ("completion_tokens", models.PositiveIntegerField(default=0)),
                        ("duration_ms", models.PositiveIntegerField(default=0)),
                        (
                            "reward_ms",
                            models.PositiveIntegerField(
                                blank=True,
                                help_text="Time the reward function took for this trajectory (a group reward's time shared among its trajectories); null when none ran.",
                                null=True,
                            ),
                        ),
                        (
                            "truncated",
                            models.BooleanField(default=False, help_text="The last completion stopped at max_tokens."),
                        ),
                        ("search_text", models.TextField(blank=True)),
                        (
                            "run",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="trajectories",
                                to="training.run",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "rollouts_trajectory",
                        "ordering": ["step", "group_id", "index"],
                    },
                ),
                migrations.AlterField(
                    model_name="rescorescore",
                    name="trajectory",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="training.trajectory"
                    ),
                ),
                migrations.CreateModel(
                    name="TrajectoryGroup",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("step", models.PositiveIntegerField()),
                        (
                            "split",
                            models.CharField(
                                choices=[("train", "Train"), ("validation", "Validation")],
                                default="train",
                                max_length=12,
                            ),
                        ),
                        ("reward_mean", models.FloatField(null=True)),
                        ("reward_std", models.FloatField(null=True)),
                        ("error_count", models.PositiveIntegerField(default=0)),
                        (
                            "skipped",
                            models.BooleanField(default=False, help_text="All rewards equal: no training signal."),
                        ),
                        (
                            "failed_attempt",
                            models.BooleanField(
                                default=False,
                                help_text="Produced by an attempt at the step that failed: kept to inspect, never trained on.",
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "run",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="groups", to="training.run"
                            ),
                        ),
                        (
                            "scenario",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT, related_name="+", to="rollouts.scenario"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "rollouts_trajectorygroup",
                        "ordering": ["step", "id"],
                    },
                ),
                migrations.AddField(
                    model_name="trajectory",
                    name="group",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="trajectories",
                        to="training.trajectorygroup",
                    ),
                ),
                migrations.AddIndex(
                    model_name="trajectorygroup",
                    index=models.Index(fields=["run", "split", "step"], name="rollouts_tr_run_id_1ee856_idx"),
                ),
                migrations.AddIndex(
                    model_name="trajectory",
                    index=models.Index(fields=["run", "step", "group"], name="rollouts_tr_run_id_47bc8b_idx"),
                ),
                migrations.AddIndex(
                    model_name="trajectory",
                    index=models.Index(fields=["run", "reward"], name="rollouts_tr_run_id_bfd3d5_idx"),
                ),
            ],
        ),
        migrations.RunPython(content_types_to_training, content_types_to_rollouts),
    ]
