"""The quotas on what a user may use, set by staff per user or per group (training.services.quotas).

Kept out of training/models.py for its length; that module imports it, so it is a model of this app.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


def validate_share_weight(value: float) -> None:
    if value is not None and not value > 0:
        raise ValidationError(
            "Give a share weight above 0 (2 gets twice the GPU time of a user at 1), or leave it empty for 1."
        )


class Quota(models.Model):
    """What one user, or each member of a group, may use: set by staff in the admin (training.services.quotas).

    A limit left empty is not set by this row: the user's own row comes first, then the most generous of
    their groups' rows that set it, then the deployment's default (ARTWEB_QUOTA_* settings). 0 is no limit.
    share_weight is no limit but the user's share in the fair queue of training steps (training.selectors_queue):
    the user's own row's, else the largest of their groups', else 1.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="quota"
    )
    group = models.OneToOneField("auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="quota")
    trajectory_mb = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="stored trajectories (MB)",
        help_text="Megabytes of trajectories (as JSON) the user's runs may store; a run is paused when a step "
        "would start past it. Empty: not set here. 0: no limit.",
    )
    concurrent_runs = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Runs queued or running at once; launching, resuming or retrying one more is refused. "
        "Empty: not set here. 0: no limit.",
    )
    steps_per_day = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="training steps a day",
        help_text="Training steps of all the user's runs in any 24 hours; a run is paused when a step would be "
        "one more. Empty: not set here. 0: no limit.",
    )
    gpu_hours_per_day = models.FloatField(
        null=True,
        blank=True,
        validators=[
            MinValueValidator(0, "Give 0 (no limit) or more hours."),
            MaxValueValidator(24_000, "Give at most 24000 hours, or 0 for no limit."),
        ],
        verbose_name="GPU hours a day",
        help_text="Hours of training steps (their wall time on a GPU worker) of all the user's runs in any 24 "
        "hours, fractions allowed; a run is paused when a step would start past it. Empty: not set here. 0: no "
        "limit.",
    )
    share_weight = models.FloatField(
        null=True,
        blank=True,
        validators=[validate_share_weight],
        help_text="The user's share of the GPU workers when runs wait for them (docs: Scheduling): a user at 2 gets "
        "twice the GPU time of a user at 1. Not a limit: an idle GPU goes to any waiting run. Empty: not set "
        "here; the user's own row's, else the largest of their groups', else 1.",
    )
    attachment_mb = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="data attachments (MB)",
        help_text="Megabytes of data attachments the user may keep (each counted in full, even when another "
        "user uploaded the same file); an upload past it is refused. Empty: not set here. 0: no limit.",
    )
    note = models.CharField(max_length=500, blank=True, help_text="Why this quota (for staff).")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["group__name", "user__username"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, group__isnull=True)
                | models.Q(user__isnull=True, group__isnull=False),
                name="quota_user_xor_group",
            ),
            models.CheckConstraint(
                condition=models.Q(share_weight__isnull=True) | models.Q(share_weight__gt=0),
                name="quota_share_weight_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(gpu_hours_per_day__isnull=True) | models.Q(gpu_hours_per_day__gte=0),
                name="quota_gpu_hours_not_negative",
            ),
        ]

    def __str__(self):
        return f"quota of {self.user or f'group {self.group}'}"
