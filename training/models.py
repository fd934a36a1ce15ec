"""Base models, runs and what they produce: trajectory groups, trajectories, per-step metrics,
checkpoints, the run timeline; dry runs of a script against a base model; exports and re-scores; the
quotas on what a user may use.

TrajectoryGroup, Trajectory and DryRun were rollouts models once: their tables keep the rollouts_ names.
"""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from training.jobs.models import BackgroundJob, JobEvent, JobStatus, job_status_field


class PretrainedModel(models.Model):
    """A base model: one that runs can fine-tune, a Hugging Face id or a local directory. (Pages, API and
    fields call it a base model; the class is not called BaseModel, which reads as pydantic's.)

    owner is null for models shared with everyone (the default model).
    """

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    name = models.CharField(max_length=200, unique=True)
    source = models.CharField(max_length=500, help_text="Hugging Face model id or a local directory.")
    revision = models.CharField(max_length=100, blank=True)
    local_path = models.CharField(max_length=1000, blank=True, help_text="Resolved directory of the weights.")
    max_length = models.PositiveIntegerField(default=2048)
    chat_template_override = models.TextField(blank=True)
    supports_tools = models.BooleanField(default=False)
    recommended_train = models.JSONField(
        default=dict,
        blank=True,
        help_text="Training settings (TrainConfig keys) that suit this model; a run's train settings that are "
        "left out take these values before artweb's defaults.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "training_basemodel"  # the table of the model's first name, BaseModel
        verbose_name = "base model"
        ordering = ["name"]

    def __str__(self):
        return self.name


class Run(BackgroundJob):
    class Status(models.TextChoices):
        QUEUED = "queued"
        STARTING = "starting"
        RUNNING = "running"
        PAUSED = "paused"
        WAITING = "waiting", "Waiting for its client"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ACTIVE_STATUSES = (Status.QUEUED, Status.STARTING, Status.RUNNING)
    FINAL_STATUSES = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=200)
    tags = ArrayField(models.CharField(max_length=50), default=list, blank=True)
    base_model = models.ForeignKey(PretrainedModel, on_delete=models.PROTECT, related_name="runs")

    class Driver(models.TextChoices):
        SCRIPT = "script", "uploaded rollout script"
        CLIENT = "client", "ART client"

    # Who rolls out: the sandbox runs the script, or an ART client posts its groups (training.client_runs).
    driver = models.CharField(max_length=10, choices=Driver.choices, default=Driver.SCRIPT)
    script_version = models.ForeignKey(
        "rollouts.RolloutScriptVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    reward_version = models.ForeignKey(
        "rollouts.RewardFunctionVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    scenario_set = models.ForeignKey("rollouts.ScenarioSet", on_delete=models.PROTECT, related_name="runs")
    config = models.JSONField(help_text="Validated RunConfig, stored whole.")

    status = job_status_field(Status)
    steps_done = models.PositiveIntegerField(default=0, help_text="Training steps completed and persisted.")
    num_steps = models.PositiveIntegerField()
    latest_reward = models.FloatField(null=True, blank=True)
    best_val_reward = models.FloatField(null=True, blank=True)
    trajectory_bytes = models.BigIntegerField(
        default=0, help_text="Bytes of the run's stored trajectories as JSON: what its owner's storage quota counts."
    )

    cancel_requested = models.BooleanField(default=False)
    pause_requested = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "status", "-created_at"])]

    def __str__(self):
        return f"{self.name} (#{self.pk})"

    @property
    def progress(self) -> float:
        return self.steps_done / self.num_steps if self.num_steps else 0.0


class TrajectoryGroup(models.Model):
    """A scenario's rollouts in one step (one role's, when each returns several), compared with each other by GRPO."""

    class Split(models.TextChoices):
        TRAIN = "train"
        VALIDATION = "validation"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="groups")
    step = models.PositiveIntegerField()
    split = models.CharField(max_length=12, choices=Split.choices, default=Split.TRAIN)
    scenario = models.ForeignKey("rollouts.Scenario", on_delete=models.PROTECT, related_name="+")
    reward_mean = models.FloatField(null=True)
    reward_std = models.FloatField(null=True)
    error_count = models.PositiveIntegerField(default=0)
    skipped = models.BooleanField(default=False, help_text="All rewards equal: no training signal.")
    failed_attempt = models.BooleanField(
        default=False, help_text="Produced by an attempt at the step that failed: kept to inspect, never trained on."
    )
    stored_bytes = models.BigIntegerField(
        default=0, help_text="Bytes of its trajectories as JSON (Run.trajectory_bytes)."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "rollouts_trajectorygroup"  # the table predates the model's move from rollouts
        ordering = ["step", "id"]
        indexes = [models.Index(fields=["run", "split", "step"])]

    def __str__(self):
        return f"group {self.pk} of run {self.run_id}, step {self.step} ({self.split})"


class Trajectory(models.Model):
    group = models.ForeignKey(TrajectoryGroup, on_delete=models.CASCADE, related_name="trajectories")
    # Denormalised from the group so the inspector's filters need no join.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="trajectories")
    step = models.PositiveIntegerField()
    index = models.PositiveSmallIntegerField(help_text="Position within the group.")
    messages = models.JSONField(default=list)
    tools = models.JSONField(null=True, blank=True)
    additional_histories = models.JSONField(default=list, blank=True)  # ART's: [{messages, tools}], each trained
    reward = models.FloatField(null=True)
    advantage = models.FloatField(null=True)
    metrics = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    logs = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    duration_ms = models.PositiveIntegerField(default=0)
    reward_ms = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Time the reward function took for this trajectory (a group reward's "
        "time shared among its trajectories); null when none ran.",
    )
    truncated = models.BooleanField(default=False, help_text="The last completion stopped at max_tokens.")
    # Concatenated message text for the inspector's text search.
    search_text = models.TextField(blank=True)

    class Meta:
        db_table = "rollouts_trajectory"
        verbose_name_plural = "trajectories"
        ordering = ["step", "group_id", "index"]
        indexes = [models.Index(fields=["run", "step", "group"]), models.Index(fields=["run", "reward"])]

    def __str__(self):
        return f"trajectory {self.pk} of run {self.run_id}, step {self.step}"


class DryRun(BackgroundJob):
    """A rollout script tried on a few scenarios against the live base model, before any run: a background
    job (training.jobs) of a GPU worker (it owns the inference server); the page polls it."""

    Status = JobStatus

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    script_version = models.ForeignKey(
        "rollouts.RolloutScriptVersion", on_delete=models.CASCADE, related_name="dry_runs"
    )
    reward_version = models.ForeignKey(
        "rollouts.RewardFunctionVersion", null=True, blank=True, on_delete=models.CASCADE, related_name="dry_runs"
    )
    base_model = models.ForeignKey(PretrainedModel, on_delete=models.CASCADE, related_name="+")
    scenarios = models.JSONField(help_text="The scenario objects tried.")
    samples = models.PositiveSmallIntegerField(
        default=1,
        help_text="Rollouts per scenario: with more than one, the result shows the reward's spread "
        "within each scenario, the signal GRPO trains on.",
    )
    attachments = models.JSONField(
        default=list,
        blank=True,
        help_text="Names of the owner's data attachments the sandbox binds read-only at /data/<name>, as a run's.",
    )
    status = job_status_field(Status)
    result = models.JSONField(null=True, blank=True, help_text="Trajectories with rewards, logs and errors.")

    class Meta:
        db_table = "rollouts_dryrun"
        ordering = ["-created_at"]

    def __str__(self):
        return f"Dry run #{self.pk} ({self.status})"


class DryRunEvent(JobEvent):
    job = models.ForeignKey(DryRun, on_delete=models.CASCADE, related_name="events")


class Step(models.Model):
    """One completed training step's metrics. Exactly one row per (run, step): the idempotence key."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    step = models.PositiveIntegerField()
    reward_mean = models.FloatField(null=True)
    reward_std = models.FloatField(null=True)
    val_reward = models.FloatField(null=True)
    metrics = models.JSONField(default=dict)
    timings = models.JSONField(default=dict, help_text="Wall seconds per phase.")
    duration_s = models.FloatField(default=0.0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="uniq_run_step")]

    def __str__(self):
        return f"{self.run_id}@{self.step}"


class HeatmapColumn(models.Model):
    """A committed step's heatmap cells for one split, written in the step's commit (training.analytics.heatmap).

    The heatmap reads these instead of averaging every group again: a 2,000-step run's page then reads
    2,000 small rows. `cells` packs, per scenario with a finite group mean, its id, its number of groups
    and the sum of their means (training.analytics.heatmap.CELL). A step's groups never change after its commit.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="heatmap_columns")
    split = models.CharField(max_length=12)
    step = models.PositiveIntegerField()
    cells = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "split", "step"], name="uniq_heatmap_column")]

    def __str__(self):
        return f"heatmap column {self.run_id}@{self.step} ({self.split})"


class Checkpoint(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active"
        DELETED = "deleted"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=1000)
    size_bytes = models.BigIntegerField(default=0)
    metrics = models.JSONField(default=dict, blank=True)
    val_reward = models.FloatField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE, db_index=True)
    promoted = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "-step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="uniq_checkpoint_run_step")]

    def __str__(self):
        return f"{self.run.name}@{self.step}"


class RunEvent(JobEvent):
    """The run's timeline: every status change and every action on it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")

    class Meta(JobEvent.Meta):
        indexes = [models.Index(fields=["run", "id"])]

    def __str__(self):
        return f"{self.kind} on run {self.run_id}"


class RunLog(models.Model):
    """A line of worker output about a run, shown in the run page's log view."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="logs")
    step = models.PositiveIntegerField(null=True, blank=True)
    level = models.CharField(max_length=10, default="INFO")
    message = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run", "id"])]

    def __str__(self):
        return f"{self.level} on run {self.run_id}: {self.message[:60]}"


class ExportTarget(models.Model):
    """Where a person's runs are mirrored: Weights & Biases, Weave or Langfuse.

    A target without a run applies to every run of its owner; one with a run applies to that run only
    and takes precedence over the owner's target of the same kind (enabled=False there opts the run out).
    The secret (an API key) is stored encrypted; left empty, the worker's environment supplies it.
    """

    class Kind(models.TextChoices):
        WANDB = "wandb", "Weights & Biases"
        WEAVE = "weave", "Weave"
        LANGFUSE = "langfuse", "Langfuse"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="export_targets")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="export_targets")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    enabled = models.BooleanField(default=True)
    settings = models.JSONField(default=dict, blank=True, help_text="Validated per-kind settings; no secrets.")
    secret_encrypted = models.TextField(blank=True)
    secret_last4 = models.CharField(max_length=4, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "kind"], condition=models.Q(run__isnull=True), name="uniq_export_owner_kind"
            ),
            models.UniqueConstraint(
                fields=["run", "kind"], condition=models.Q(run__isnull=False), name="uniq_export_run_kind"
            ),
        ]

    def __str__(self):
        return f"{self.get_kind_display()} for {self.run or self.owner}"


class ExportProgress(models.Model):
    """How far one target has mirrored one run: the cursor that makes a retried export repeat nothing."""

    target = models.ForeignKey(ExportTarget, on_delete=models.CASCADE, related_name="progress")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="export_progress")
    last_step = models.PositiveIntegerField(default=0, help_text="Steps up to this one are exported.")
    finished = models.BooleanField(default=False, help_text="The run's final state is exported.")
    remote_id = models.CharField(max_length=100, blank=True, help_text="The run's id at the service.")
    failures = models.PositiveIntegerField(default=0, help_text="Consecutive failed attempts.")
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "export progress"
        constraints = [models.UniqueConstraint(fields=["target", "run"], name="uniq_export_progress")]

    def __str__(self):
        return f"{self.target} up to step {self.last_step}"


class JudgeEndpoint(models.Model):
    """An OpenAI-compatible server outside artweb that a person's RULER runs may use as their judge.

    The key is stored encrypted and never shown again (only its last four characters); the worker adds it
    to the judge's requests on their way out of the sandbox, so user code never sees it.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="judge_endpoints")
    name = models.CharField(max_length=100, help_text='How runs refer to it: ruler_judge "endpoint:<name>".')
    base_url = models.URLField(max_length=500, help_text="The server's OpenAI-compatible base URL, ending in /v1.")
    model = models.CharField(max_length=200, help_text="The judge model's name at that server.")
    key_encrypted = models.TextField(blank=True)
    key_last4 = models.CharField(max_length=4, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="uniq_judge_endpoint_owner_name")]

    def __str__(self):
        return f"{self.name} ({self.model} at {self.base_url})"


class Rescore(BackgroundJob):
    """A run's stored trajectories scored again by another reward function version (or RULER), without
    touching training: each trajectory's old and new reward, how well they agree, and the reward curve the
    run would have had. A background job of the default queue (training.jobs); the run may still train."""

    Status = JobStatus

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rescores")
    reward_version = models.ForeignKey(
        "rollouts.RewardFunctionVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    use_ruler = models.BooleanField(default=False)
    ruler_judge = models.CharField(max_length=200, blank=True)
    split = models.CharField(max_length=12, default="train")
    status = job_status_field(Status)
    trajectories_total = models.PositiveIntegerField(default=0)
    trajectories_done = models.PositiveIntegerField(default=0)
    summary = models.JSONField(default=dict, blank=True, help_text="Agreement figures and the re-scored curve.")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"Re-score #{self.pk} of {self.run}"


class RescoreEvent(JobEvent):
    job = models.ForeignKey(Rescore, on_delete=models.CASCADE, related_name="events")


class RescoreScore(models.Model):
    """One trajectory's reward under the run and under the re-score."""

    rescore = models.ForeignKey(Rescore, on_delete=models.CASCADE, related_name="scores")
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="+")
    step = models.PositiveIntegerField()
    old_reward = models.FloatField(null=True)
    new_reward = models.FloatField(null=True)
    error = models.TextField(blank=True)
    reward_ms = models.PositiveIntegerField(null=True, blank=True)
    metrics = models.JSONField(
        default=dict,
        blank=True,
        help_text="What the new reward put in the trajectory's metrics (RULER: the judge's reason).",
    )
    rank_gap = models.FloatField(
        null=True,
        blank=True,
        help_text="|rank under the new reward - rank under the old| among the scored pairs, set when it is done.",
    )

    class Meta:
        ordering = ["step", "trajectory_id"]
        constraints = [models.UniqueConstraint(fields=["rescore", "trajectory"], name="uniq_rescore_trajectory")]
        indexes = [models.Index(fields=["rescore", "step"])]

    def __str__(self):
        return f"trajectory {self.trajectory_id}: {self.old_reward} → {self.new_reward}"


# Models of this app kept in modules of their own, for this one's length (training.user_secrets, training.quota_model).
from training.quota_model import Quota  # noqa: E402, F401
from training.user_secrets import UserSecret  # noqa: E402, F401
