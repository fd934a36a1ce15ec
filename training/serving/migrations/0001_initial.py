"""CheckpointAlias, ServeJob and DiffScenario, training models until now (training 0012 made their tables),
join serving's state; their tables keep the training_ names and no row is copied. training 0014 removes
them from training's state after this one."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("rollouts", "0007_reward_timing_truncated_dry_run_samples"),
        ("training", "0013_quotas"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name="ServeJob",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[("playground", "Playground"), ("diff", "Diff")], db_index=True, max_length=12
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
                                db_index=True,
                                default="queued",
                                max_length=10,
                            ),
                        ),
                        (
                            "model_names",
                            models.JSONField(
                                default=list, help_text="The model names asked for, as the endpoint takes them."
                            ),
                        ),
                        (
                            "params",
                            models.JSONField(blank=True, default=dict, help_text="Prompt, samples, sampling settings."),
                        ),
                        ("progress_done", models.PositiveIntegerField(default=0)),
                        ("progress_total", models.PositiveIntegerField(default=0)),
                        ("result", models.JSONField(blank=True, default=dict)),
                        ("error", models.TextField(blank=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("started_at", models.DateTimeField(blank=True, null=True)),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
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
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="rollouts.rewardfunctionversion",
                            ),
                        ),
                        (
                            "scenario_set",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="rollouts.scenarioset",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "training_servejob",
                        "ordering": ["-created_at"],
                    },
                ),
                migrations.CreateModel(
                    name="CheckpointAlias",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.CharField(max_length=100)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "checkpoint",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="aliases",
                                to="training.checkpoint",
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
                    ],
                    options={
                        "db_table": "training_checkpointalias",
                        "ordering": ["name"],
                        "constraints": [
                            models.UniqueConstraint(fields=("owner", "name"), name="uniq_checkpoint_alias_owner_name")
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="DiffScenario",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("index", models.PositiveIntegerField()),
                        (
                            "reward_a",
                            models.FloatField(
                                blank=True, help_text="Mean reward of side A's scored answers.", null=True
                            ),
                        ),
                        ("reward_b", models.FloatField(blank=True, null=True)),
                        ("delta", models.FloatField(blank=True, help_text="reward_b - reward_a", null=True)),
                        ("answers_a", models.JSONField(default=list)),
                        ("answers_b", models.JSONField(default=list)),
                        (
                            "scenario",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="+", to="rollouts.scenario"
                            ),
                        ),
                        (
                            "job",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="diff_scenarios",
                                to="serving.servejob",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "training_diffscenario",
                        "ordering": ["job", "index"],
                        "constraints": [models.UniqueConstraint(fields=("job", "scenario"), name="uniq_diff_scenario")],
                    },
                ),
            ],
        ),
    ]
