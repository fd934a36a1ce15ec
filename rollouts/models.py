"""Rollout scripts, reward functions, scenario sets, and the trajectories runs produce.

Scripts and reward functions are named assets with immutable, content-addressed versions: a run pins
a version, so editing an asset never changes what a finished run executed.
"""

from django.conf import settings
from django.db import models


class CodeAsset(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True
        ordering = ["-updated_at"]

    def __str__(self):
        return self.name

    @property
    def latest_version(self):
        return self.versions.order_by("-number").first()


class CodeVersion(models.Model):
    number = models.PositiveIntegerField()
    content = models.TextField()
    sha256 = models.CharField(max_length=64)
    note = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["-number"]

    def __str__(self):
        return f"{self.asset.name} v{self.number}"


class RolloutScript(CodeAsset):
    # The reward function written for this script: the launch form preselects its newest version.
    companion_reward = models.ForeignKey(
        "RewardFunction",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Reward function that goes with this script; the launch form preselects its newest version.",
    )

    class Meta(CodeAsset.Meta):
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="uniq_script_owner_name")]


class RolloutScriptVersion(CodeVersion):
    asset = models.ForeignKey(RolloutScript, on_delete=models.CASCADE, related_name="versions")

    class Meta(CodeVersion.Meta):
        constraints = [
            models.UniqueConstraint(fields=["asset", "number"], name="uniq_script_version_number"),
            models.UniqueConstraint(fields=["asset", "sha256"], name="uniq_script_version_sha"),
        ]


class RewardFunction(CodeAsset):
    class Kind(models.TextChoices):
        TRAJECTORY = "trajectory", "Per trajectory: reward(trajectory, scenario)"
        GROUP = "group", "Per group: score_group(group, scenario)"

    class Meta(CodeAsset.Meta):
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="uniq_reward_owner_name")]


class RewardFunctionVersion(CodeVersion):
    asset = models.ForeignKey(RewardFunction, on_delete=models.CASCADE, related_name="versions")
    kind = models.CharField(max_length=20, choices=RewardFunction.Kind.choices)

    class Meta(CodeVersion.Meta):
        constraints = [
            models.UniqueConstraint(fields=["asset", "number"], name="uniq_reward_version_number"),
            models.UniqueConstraint(fields=["asset", "sha256"], name="uniq_reward_version_sha"),
        ]


class ScenarioSet(models.Model):
    """A JSONL upload; each line one scenario (a JSON object). Immutable once created."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    sha256 = models.CharField(max_length=64)
    train_count = models.PositiveIntegerField(default=0)
    validation_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="uniq_scenarioset_owner_name")]

    def __str__(self):
        return self.name


class Scenario(models.Model):
    class Split(models.TextChoices):
        TRAIN = "train"
        VALIDATION = "validation"

    scenario_set = models.ForeignKey(ScenarioSet, on_delete=models.CASCADE, related_name="scenarios")
    index = models.PositiveIntegerField(help_text="Line number in the upload, from 0.")
    split = models.CharField(max_length=12, choices=Split.choices)
    data = models.JSONField()

    class Meta:
        ordering = ["index"]
        constraints = [models.UniqueConstraint(fields=["scenario_set", "index"], name="uniq_scenario_index")]
        indexes = [models.Index(fields=["scenario_set", "split", "index"])]

    def __str__(self):
        return f"{self.scenario_set} #{self.index} ({self.split})"


class TrajectoryGroup(models.Model):
    """The group_size rollouts of one scenario in one step, compared against each other by GRPO."""

    class Split(models.TextChoices):
        TRAIN = "train"
        VALIDATION = "validation"

    run = models.ForeignKey("training.Run", on_delete=models.CASCADE, related_name="groups")
    step = models.PositiveIntegerField()
    split = models.CharField(max_length=12, choices=Split.choices, default=Split.TRAIN)
    scenario = models.ForeignKey(Scenario, on_delete=models.PROTECT, related_name="+")
    reward_mean = models.FloatField(null=True)
    reward_std = models.FloatField(null=True)
    error_count = models.PositiveIntegerField(default=0)
    skipped = models.BooleanField(default=False, help_text="All rewards equal: no training signal.")
    failed_attempt = models.BooleanField(
        default=False, help_text="Produced by an attempt at the step that failed: kept to inspect, never trained on."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step", "id"]
        indexes = [models.Index(fields=["run", "split", "step"])]

    def __str__(self):
        return f"group {self.pk} of run {self.run_id}, step {self.step} ({self.split})"


class Trajectory(models.Model):
    group = models.ForeignKey(TrajectoryGroup, on_delete=models.CASCADE, related_name="trajectories")
    # Denormalised from the group so the inspector's filters need no join.
    run = models.ForeignKey("training.Run", on_delete=models.CASCADE, related_name="trajectories")
    step = models.PositiveIntegerField()
    index = models.PositiveSmallIntegerField(help_text="Position within the group.")
    messages = models.JSONField(default=list)
    tools = models.JSONField(null=True, blank=True)
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
        ordering = ["step", "group_id", "index"]
        indexes = [
            models.Index(fields=["run", "step", "group"]),
            models.Index(fields=["run", "reward"]),
        ]

    def __str__(self):
        return f"trajectory {self.pk} of run {self.run_id}, step {self.step}"


class DryRun(models.Model):
    """A rollout script tried on a few scenarios against the live base model, before any run.

    Executed by a GPU worker (it owns the inference server); the page or API polls for the result.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    script_version = models.ForeignKey(RolloutScriptVersion, on_delete=models.CASCADE, related_name="dry_runs")
    reward_version = models.ForeignKey(
        RewardFunctionVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="dry_runs"
    )
    base_model = models.ForeignKey("training.BaseModel", on_delete=models.CASCADE, related_name="+")
    scenarios = models.JSONField(help_text="The scenario objects tried.")
    samples = models.PositiveSmallIntegerField(
        default=1,
        help_text="Rollouts per scenario: with more than one, the result shows the reward's spread "
        "within each scenario, the signal GRPO trains on.",
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    result = models.JSONField(null=True, blank=True, help_text="Trajectories with rewards, logs and errors.")
    error = models.TextField(blank=True)
    # When the broker took this dry run's message; null while one is owed (the sweep sends it).
    dispatched_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"Dry run #{self.pk} ({self.status})"
