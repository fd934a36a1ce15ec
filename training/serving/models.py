"""Rows for using what a run trained: checkpoint aliases (names the OpenAI-compatible endpoint answers
to), playground sessions, and answer diffs between two models over a scenario set's held-out split.

They were training models once: their tables keep the training_ names.
"""

from django.conf import settings
from django.db import models

from training.jobs.models import BackgroundJob, JobEvent, JobStatus, job_status_field


class CheckpointAlias(models.Model):
    """A name of the owner's for one of their checkpoints: `model="my-agent"` on the endpoint.

    Giving a checkpoint an alias promotes it (training.services.checkpoints.checkpoint_promote)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    checkpoint = models.ForeignKey("training.Checkpoint", on_delete=models.CASCADE, related_name="aliases")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "training_checkpointalias"
        verbose_name_plural = "checkpoint aliases"
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="uniq_checkpoint_alias_owner_name")]

    def __str__(self):
        return self.name


class ServeJob(BackgroundJob):
    """A playground session or an answer diff: background work that generates through the serving
    endpoint's workers and scores the answers in the jail. A background job (training.jobs) of the
    default queue."""

    class Kind(models.TextChoices):
        PLAYGROUND = "playground"
        DIFF = "diff"

    Status = JobStatus

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=12, choices=Kind.choices, db_index=True)
    status = job_status_field(Status)
    model_names = models.JSONField(default=list, help_text="The model names asked for, as the endpoint takes them.")
    scenario_set = models.ForeignKey(
        "rollouts.ScenarioSet", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    reward_version = models.ForeignKey(
        "rollouts.RewardFunctionVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    params = models.JSONField(default=dict, blank=True, help_text="Prompt, samples, sampling settings.")
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    result = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "training_servejob"
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.get_kind_display()} #{self.pk}"


class ServeJobEvent(JobEvent):
    job = models.ForeignKey(ServeJob, on_delete=models.CASCADE, related_name="events")


class DiffScenario(models.Model):
    """One held-out scenario of an answer diff: each side's answers and rewards, and the change."""

    job = models.ForeignKey(ServeJob, on_delete=models.CASCADE, related_name="diff_scenarios")
    scenario = models.ForeignKey("rollouts.Scenario", on_delete=models.CASCADE, related_name="+")
    index = models.PositiveIntegerField()
    reward_a = models.FloatField(null=True, blank=True, help_text="Mean reward of side A's scored answers.")
    reward_b = models.FloatField(null=True, blank=True)
    delta = models.FloatField(null=True, blank=True, help_text="reward_b - reward_a")
    answers_a = models.JSONField(default=list)  # [{"content", "tool_calls", "reward", "error", "metrics"}]
    answers_b = models.JSONField(default=list)

    class Meta:
        db_table = "training_diffscenario"
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "scenario"], name="uniq_diff_scenario")]

    def __str__(self):
        return f"{self.job} scenario {self.index}"
