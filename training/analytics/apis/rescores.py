"""Re-scores: a run's stored trajectories scored again by another reward function version (or RULER);
start one, follow its progress, read its agreement figures and each trajectory's old and new reward."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import (
    MAX_INT,
    PAGE_PARAMETERS,
    Api,
    WriteThrottle,
    body,
    paginated_response,
    paginated_schema,
    query_params,
)
from artweb.api_errors import ErrorSerializer
from artweb.errors import ApplicationError
from rollouts.selectors import reward_version_list
from training import selectors
from training.analytics import rescores as service
from training.apis.common import VersionRefOutput
from training.models import Rescore, TrajectoryGroup


class RescoreOutput(serializers.Serializer):
    id = serializers.IntegerField()
    run = serializers.IntegerField(source="run_id")
    status = serializers.ChoiceField(choices=Rescore.Status.choices)
    reward = VersionRefOutput(source="reward_version", allow_null=True)
    use_ruler = serializers.BooleanField()
    ruler_judge = serializers.CharField()
    split = serializers.CharField()
    trajectories_total = serializers.IntegerField()
    trajectories_done = serializers.IntegerField()
    error = serializers.CharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class RescoreDetailOutput(RescoreOutput):
    summary = serializers.JSONField(
        help_text=(
            "When done: spearman, kendall_tau (tau-b), pair_agreement (share of pairs within a group ordered "
            "alike), group_pairs, mean_abs_diff, old_mean, new_mean, trajectories, paired, errors, curve "
            "{steps, old, new} (mean reward per step) and disagreements (largest rank gap first)."
        )
    )


class RescoreScoreOutput(serializers.Serializer):
    trajectory = serializers.IntegerField(source="trajectory_id")
    step = serializers.IntegerField()
    old_reward = serializers.FloatField(allow_null=True)
    new_reward = serializers.FloatField(allow_null=True)
    rank_gap = serializers.FloatField(
        allow_null=True, help_text="|new rank - old rank|; set when the re-score is done."
    )
    error = serializers.CharField()
    reward_ms = serializers.IntegerField(allow_null=True)
    metrics = serializers.JSONField()


class RunRescoreListApi(Api):
    """GET: the run's re-scores, newest first. POST: start one (a reward function version, or RULER with a
    judge endpoint) over what the run has stored now."""

    throttle_scope = "writes"

    def get_throttles(self):
        return [WriteThrottle()] if self.request.method == "POST" else []

    class InputSerializer(serializers.Serializer):
        reward_version = serializers.IntegerField(
            required=False,
            allow_null=True,
            default=None,
            min_value=1,
            max_value=MAX_INT,
            help_text="Id of one of your reward function versions (version_id in the rewards API).",
        )
        use_ruler = serializers.BooleanField(required=False, default=False)
        ruler_judge = serializers.CharField(
            required=False,
            default="",
            allow_blank=True,
            max_length=200,
            help_text="endpoint:<name>, one of your judge endpoints.",
        )
        split = serializers.ChoiceField(choices=TrajectoryGroup.Split.choices, required=False, default="train")

    @extend_schema(
        operation_id="runs_rescores_list",
        parameters=PAGE_PARAMETERS,
        responses={200: paginated_schema(RescoreOutput, "PaginatedRescoreList"), 404: ErrorSerializer},
    )
    def get(self, request, run_id: int):
        run = selectors.run_get(user=request.user, run_id=run_id)
        qs = service.rescore_list(user=request.user, run=run)
        return paginated_response(request=request, view=self, queryset=qs, serializer_class=RescoreOutput)

    @extend_schema(
        operation_id="runs_rescores_create",
        request=InputSerializer,
        responses={201: RescoreDetailOutput, 400: ErrorSerializer, 404: ErrorSerializer},
    )
    def post(self, request, run_id: int):
        run = selectors.run_get(user=request.user, run_id=run_id)
        data = body(self.InputSerializer, request)
        version = None
        if data["reward_version"] is not None:
            version = reward_version_list(user=request.user).filter(id=data["reward_version"]).first()
            if version is None:
                raise ApplicationError(
                    f"No reward function version {data['reward_version']} among yours. Give the version_id "
                    "that GET /api/v1/rewards/{id}/versions/ lists.",
                    field_errors={"reward_version": ["not found"]},
                )
        rescore = service.rescore_create(
            user=request.user,
            run=run,
            reward_version=version,
            use_ruler=data["use_ruler"],
            ruler_judge=data["ruler_judge"],
            split=data["split"],
        )
        return Response(RescoreDetailOutput(rescore).data, status=201)


class RescoreDetailApi(Api):
    @extend_schema(operation_id="rescores_retrieve", responses={200: RescoreDetailOutput, 404: ErrorSerializer})
    def get(self, request, rescore_id: int):
        return Response(RescoreDetailOutput(service.rescore_get(user=request.user, rescore_id=rescore_id)).data)


class RescoreScoreListApi(Api):
    """Each trajectory's old and new reward; disagreements (largest rank gap, then |new - old|) first."""

    class FilterSerializer(serializers.Serializer):
        ordering = serializers.ChoiceField(choices=list(service.ORDERINGS), required=False, default="disagreement")

    @extend_schema(
        operation_id="rescores_scores",
        parameters=[FilterSerializer, *PAGE_PARAMETERS],
        responses={
            200: paginated_schema(RescoreScoreOutput, "PaginatedRescoreScoreList"),
            400: ErrorSerializer,
            404: ErrorSerializer,
        },
    )
    def get(self, request, rescore_id: int):
        rescore = service.rescore_get(user=request.user, rescore_id=rescore_id)
        ordering = query_params(self.FilterSerializer, request)["ordering"]
        return paginated_response(
            request=request,
            view=self,
            queryset=service.rescore_scores(rescore=rescore, ordering=ordering),
            serializer_class=RescoreScoreOutput,
        )
