"""Dry runs and re-scores become background jobs of one model (training.jobs): each gains the fields the
others had (a worker's lease, started_at), a timeline of its own, and the status column runs have.
Run events name the worker involved. Columns are only added or widened: every row stays."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models.functions import Now

STATUS = models.CharField(
    choices=[("queued", "Queued"), ("running", "Running"), ("done", "Done"), ("failed", "Failed")],
    db_index=True,
    default="queued",
    max_length=12,
)


def _running_since_now(apps, schema_editor):
    # A job running before leases existed has no heartbeat: give it one now, so the sweep recovers it a
    # lease from now if no worker holds it (until then no worker heartbeated it, and none would).
    for name in ("DryRun", "Rescore"):
        apps.get_model("training", name).objects.filter(status="running").update(heartbeat_at=Now())


def _event_model(name: str, job: str):
    return migrations.CreateModel(
        name=name,
        fields=[
            ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
            ("kind", models.CharField(max_length=50)),
            ("message", models.TextField(blank=True)),
            ("data", models.JSONField(blank=True, default=dict)),
            ("worker", models.CharField(blank=True, max_length=200)),
            ("created_at", models.DateTimeField(auto_now_add=True)),
            (
                "actor",
                models.ForeignKey(
                    blank=True,
                    null=True,
                    on_delete=django.db.models.deletion.SET_NULL,
                    related_name="+",
                    to=settings.AUTH_USER_MODEL,
                ),
            ),
            (
                "job",
                models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="events", to=job),
            ),
        ],
        options={"ordering": ["id"], "abstract": False},
    )


class Migration(migrations.Migration):
    dependencies = [
        ("training", "0014_serving_moves_to_its_own_app"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="dryrun", name="heartbeat_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.AddField(model_name="dryrun", name="started_at", field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="dryrun", name="worker", field=models.CharField(blank=True, max_length=200)),
        migrations.AddField(
            model_name="rescore", name="heartbeat_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.AddField(model_name="rescore", name="worker", field=models.CharField(blank=True, max_length=200)),
        migrations.AddField(model_name="runevent", name="worker", field=models.CharField(blank=True, max_length=200)),
        migrations.AlterField(model_name="dryrun", name="status", field=STATUS),
        migrations.AlterField(model_name="rescore", name="status", field=STATUS),
        _event_model("DryRunEvent", "training.dryrun"),
        _event_model("RescoreEvent", "training.rescore"),
        migrations.RunPython(_running_since_now, migrations.RunPython.noop),
    ]
