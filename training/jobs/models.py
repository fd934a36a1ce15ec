"""What every background job's row holds, and what its timeline's rows hold (training.jobs).

The concrete jobs (Run, DryRun, Rescore, ServeJob) and their event models live with their apps; these
abstract bases give them the same fields, so one set of functions claims, heartbeats, finishes, fails and
recovers all of them.
"""

from django.conf import settings
from django.db import models

# Statuses every kind of job has, under these names (a kind may have more: a run's "paused").
QUEUED = "queued"
RUNNING = "running"
DONE = "done"
FAILED = "failed"


class JobStatus(models.TextChoices):
    """The statuses of a job that has no others (dry runs, re-scores, serve jobs)."""

    QUEUED = QUEUED
    RUNNING = RUNNING
    DONE = DONE
    FAILED = FAILED


def job_status_field(status: type[models.TextChoices]) -> models.CharField:
    """A job's status column, with its kind's choices: queued when created, indexed for the sweep."""
    return models.CharField(max_length=12, choices=status.choices, default=QUEUED, db_index=True)


class BackgroundJob(models.Model):
    """A row a worker does in the background: queued, claimed by one worker (worker + heartbeat_at: its
    lease), then done or failed. Each kind declares `status = job_status_field(Status)` and its
    FINAL_STATUSES; a job in a final status is never claimed again."""

    FINAL_STATUSES: tuple[str, ...] = (DONE, FAILED)

    # The worker holding the job and when it last said so; a lease past its kind's length is free to take.
    worker = models.CharField(max_length=200, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When the broker took the job's latest message; null while one is owed (the sweep sends it).
    dispatched_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class JobEvent(models.Model):
    """One row of a job's timeline: every status change (kind "status", data {"from", "to"}) and every
    action on it. Each kind of job has its own event model, with a foreign key to the job whose
    related name is `events`."""

    kind = models.CharField(max_length=50)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    # The worker that held the job when it changed (or that took it); blank when none did.
    worker = models.CharField(max_length=200, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["id"]

    def __str__(self):
        return f"{self.kind}: {self.message[:60]}"
