"""A run's reward health: reward-function errors by kind, reward latency, the slowest trajectories."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import MAX_INT, Api, query_params
from artweb.api_errors import ErrorSerializer
from training import selectors
from training.analytics.reward_health import STAGES, run_reward_health


class RunRewardHealthApi(Api):
    """Reward-function errors by stage and exception type (with an example each), reward latency p50/p95/max
    overall and per step, the share of each step's trajectories whose reward failed, and the slowest
    trajectories by reward time. Latencies are in milliseconds."""

    class FilterSerializer(serializers.Serializer):
        step_from = serializers.IntegerField(
            required=False, min_value=0, max_value=MAX_INT, help_text="First step included (default: the first)."
        )
        step_to = serializers.IntegerField(
            required=False, min_value=0, max_value=MAX_INT, help_text="Last step included (default: the last)."
        )

        def validate(self, data):
            if (
                data.get("step_from") is not None
                and data.get("step_to") is not None
                and data["step_from"] > data["step_to"]
            ):
                raise serializers.ValidationError({"step_to": ["must be at least step_from"]})
            return data

    class OutputSerializer(serializers.Serializer):
        class ErrorKindSerializer(serializers.Serializer):
            class ExampleSerializer(serializers.Serializer):
                trajectory = serializers.IntegerField()
                step = serializers.IntegerField()
                message = serializers.CharField(help_text="The example's error (first 2,000 characters).")
                link = serializers.CharField(help_text="The trajectory in the inspector.")

            stage = serializers.ChoiceField(
                choices=STAGES,
                help_text=(
                    "reward: the reward function raised; timeout: it did not finish in time; rollout: the script "
                    "failed before a reward could run."
                ),
            )
            type = serializers.CharField(
                help_text=(
                    '"reward was NaN", "reward was infinite" or "reward was not a number" for a reward that was '
                    "not a finite number; else the exception's name, or the message's first line."
                )
            )
            count = serializers.IntegerField()
            example = ExampleSerializer()

        class LatencySerializer(serializers.Serializer):
            p50_ms = serializers.FloatField(allow_null=True)
            p95_ms = serializers.FloatField(allow_null=True)
            max_ms = serializers.FloatField(allow_null=True)

        class StepSerializer(LatencySerializer):
            step = serializers.IntegerField()
            trajectories = serializers.IntegerField()
            reward_errors = serializers.IntegerField(help_text="Reward errors and reward timeouts.")
            reward_error_share = serializers.FloatField()

        class SlowSerializer(serializers.Serializer):
            trajectory = serializers.IntegerField()
            step = serializers.IntegerField()
            reward_ms = serializers.IntegerField()
            reward = serializers.FloatField(allow_null=True)
            error = serializers.CharField(allow_blank=True)
            link = serializers.CharField()

        step_from = serializers.IntegerField(allow_null=True)
        step_to = serializers.IntegerField(allow_null=True)
        trajectories = serializers.IntegerField(help_text="Trajectories in the step range.")
        reward_timed = serializers.IntegerField(help_text="Of them, those the reward function ran on.")
        errors = ErrorKindSerializer(many=True)
        latency = LatencySerializer()
        per_step = StepSerializer(many=True)
        slowest = SlowSerializer(many=True)

    @extend_schema(
        operation_id="runs_reward_health",
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, 400: ErrorSerializer, 404: ErrorSerializer},
    )
    def get(self, request, run_id: int):
        run = selectors.run_get(user=request.user, run_id=run_id)
        f = query_params(self.FilterSerializer, request)
        data = run_reward_health(run=run, step_from=f.get("step_from"), step_to=f.get("step_to"))
        return Response(self.OutputSerializer(data).data)
