"""An ART client's model (a client-driven run) and its training jobs, each one step of the run."""

from django.conf import settings
from django.db import models


class ClientModel(models.Model):
    """What ART's `TrainableModel(project=, name=, base_model=)` registered: one run of its owner.

    The client knows it by `id` (the run's id as a string) and names its checkpoints for inference
    `wandb-artifact:///<entity>/<project>/<name>[:step<N>]`; entity is the owner's username unless the
    client sent another."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    run = models.OneToOneField("training.Run", on_delete=models.CASCADE, related_name="client_model")
    entity = models.CharField(max_length=100)
    project = models.CharField(max_length=100)
    name = models.CharField(max_length=100)
    base_model_requested = models.CharField(max_length=300, help_text="base_model as the client sent it.")
    contacted_at = models.DateTimeField(null=True, blank=True, help_text="The client's last call.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "entity", "project", "name"], name="uniq_client_model_name")
        ]

    def __str__(self):
        return f"{self.entity}/{self.project}/{self.name}"

    @property
    def inference_name(self) -> str:
        return f"wandb-artifact:///{self.entity}/{self.project}/{self.name}"


class ClientTrainingJob(models.Model):
    """One `POST /preview/training-jobs`: the client's scored groups, checked and converted, waiting for
    (or trained in) one step of the run. It commits with the step or fails leaving the run as it was."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    PENDING = (Status.QUEUED, Status.RUNNING)

    run = models.ForeignKey("training.Run", on_delete=models.CASCADE, related_name="client_jobs")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    groups = models.JSONField(help_text="[{scenario: <id>, trajectories: [record, ...]}] as artweb stores them.")
    settings = models.JSONField(default=dict, help_text="The train settings the job asked for (TrainConfig keys).")
    tokens = models.JSONField(default=dict, help_text="How many sampled turns came with token ids and logprobs.")
    step = models.PositiveIntegerField(null=True, blank=True, help_text="The step it became, once committed.")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run", "status", "id"])]

    def __str__(self):
        return f"training job {self.pk} of run {self.run_id} ({self.status})"


class ClientTrainingJobEvent(models.Model):
    """What the client polls (`GET /preview/training-jobs/<id>/events?after=`): training_started,
    gradient_step, then training_ended or training_failed. Ids increase, so `after` pages them."""

    class Type(models.TextChoices):
        STARTED = "training_started"
        GRADIENT_STEP = "gradient_step"
        ENDED = "training_ended"
        FAILED = "training_failed"

    job = models.ForeignKey(ClientTrainingJob, on_delete=models.CASCADE, related_name="events")
    type = models.CharField(max_length=20, choices=Type.choices)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"{self.type} of {self.job_id}"
