"""Your quotas: what your runs use against what they may (stored trajectories, runs queued or running,
training steps and GPU hours in the last 24 hours, data attachments). Staff set the limits in the admin
(training.services.quotas)."""

from __future__ import annotations

from dataclasses import asdict

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import Api
from training.selectors import QUOTA_FIELDS, quota_status


class QuotaLineOutput(serializers.Serializer):
    key = serializers.ChoiceField(choices=[key for key, *_ in QUOTA_FIELDS.values()])
    label = serializers.CharField()
    used = serializers.IntegerField(
        help_text="Bytes for trajectory_bytes and attachment_bytes, seconds of training steps for gpu_seconds, runs "
        "or steps for the others."
    )
    limit = serializers.IntegerField(allow_null=True, help_text="In the same unit; null: no limit.")
    reached = serializers.BooleanField(help_text="used has reached limit: see the endpoint's description.")
    source = serializers.CharField(help_text='Where the limit comes from: "your own quota", a group\'s, "the default".')


class QuotaApi(Api):
    """Your quotas and your usage of each. A run whose next step would go past the stored-trajectories, the
    steps-a-day or the GPU-hours-a-day limit is paused before that step (its events say which quota and what
    to do); launching, resuming or retrying a run past the runs-at-once limit is refused with a 400."""

    class OutputSerializer(serializers.Serializer):
        quotas = QuotaLineOutput(many=True)

    @extend_schema(operation_id="quota_retrieve", responses={200: OutputSerializer})
    def get(self, request):
        lines = [{**asdict(line), "reached": line.reached} for line in quota_status(user=request.user)]
        return Response(self.OutputSerializer({"quotas": lines}).data)
