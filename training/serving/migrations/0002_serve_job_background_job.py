"""ServeJob becomes a background job of the one job model (training.jobs): a worker's lease, dispatched_at
(so one created while the broker was down is sent by the sweep), a timeline of its own, and the status
column the other jobs have. Columns are only added or widened: every row stays."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models.functions import Now


def _owed_and_held(apps, schema_editor):
    ServeJob = apps.get_model("serving", "ServeJob")
    # A job past queued had its message: owe it nothing. A queued one may never have been sent (the broker
    # was down): owed, the sweep sends it, and a duplicate message does nothing (a claim takes a job once).
    ServeJob.objects.exclude(status="queued").update(dispatched_at=Now())
    # A running one has no heartbeat yet: one now, so the sweep recovers it a lease from now if no worker
    # holds it.
    ServeJob.objects.filter(status="running").update(heartbeat_at=Now())


class Migration(migrations.Migration):
    dependencies = [
        ("serving", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="servejob", name="dispatched_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.AddField(
            model_name="servejob", name="heartbeat_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.AddField(model_name="servejob", name="worker", field=models.CharField(blank=True, max_length=200)),
        migrations.AlterField(
            model_name="servejob",
            name="status",
            field=models.CharField(
                choices=[("queued", "Queued"), ("running", "Running"), ("done", "Done"), ("failed", "Failed")],
                db_index=True,
                default="queued",
                max_length=12,
            ),
        ),
        migrations.CreateModel(
            name="ServeJobEvent",
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
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="events", to="serving.servejob"
                    ),
                ),
            ],
            options={"ordering": ["id"], "abstract": False},
        ),
        migrations.RunPython(_owed_and_held, migrations.RunPython.noop),
    ]
