"""Rollout scripts, reward functions, scenario sets and data attachments: what a run executes and trains on.

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
    # A bundle upload (rollouts.sandbox.bundles): the stored zip's hash, its file DATA_DIR/bundles/<hash>.zip.
    # `content` is then the bundle's rollout.py and `sha256` the bundle's hash; blank for a plain script.
    bundle_sha256 = models.CharField(max_length=64, blank=True, default="")

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


class DataAttachment(models.Model):
    """A file a run's rollouts read at /data/<name> in the jail (a SQLite database, JSON, parquet). Immutable:
    a run names it, so the name keeps its content until it is deleted; another content needs another name.

    The bytes are stored once per content hash (rollouts.selectors.attachment_dir), however many people
    upload them; each row counts its size against its owner's quota."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100, help_text="The file's name in the jail: /data/<name>.")
    description = models.TextField(blank=True)
    sha256 = models.CharField(max_length=64, db_index=True)
    size = models.PositiveBigIntegerField(help_text="Bytes.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="uniq_attachment_owner_name")]

    def __str__(self):
        return self.name
