"""Runs: create (and start), list with filters, detail, the lifecycle actions, metrics, events, logs."""

from __future__ import annotations

import re

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import (
    MAX_ID,
    MAX_INT,
    PAGE_PARAMETERS,
    Api,
    WriteApi,
    body,
    paginated_response,
    paginated_schema,
    query_params,
)
from artweb.api_errors import ErrorSerializer
from training import selectors, services
from training.analytics.alerts import alert_rules, run_alert_rules_update
from training.apis.common import (
    IdOrNameField,
    RefOutput,
    VersionRefOutput,
    resolve_base_model,
    resolve_reward_version,
    resolve_scenario_set,
    resolve_script_version,
)
from training.config import AlertRules
from training.models import Run
from training.selectors_queue import run_queue_place

ERRORS = {400: ErrorSerializer, 404: ErrorSerializer}


class RunOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    owner = serializers.CharField(source="owner.username")
    status = serializers.ChoiceField(choices=Run.Status.choices)
    tags = serializers.ListField(child=serializers.CharField())
    base_model = RefOutput()
    driver = serializers.ChoiceField(
        choices=Run.Driver.choices,
        help_text="Who rolls out: artweb runs the uploaded script, or an ART client posts its scored groups.",
    )
    script = VersionRefOutput(
        source="script_version", allow_null=True, help_text="The rollout script; null for a client-driven run."
    )
    reward = VersionRefOutput(source="reward_version", allow_null=True)
    scenario_set = RefOutput()
    steps_done = serializers.IntegerField()
    num_steps = serializers.IntegerField()
    progress = serializers.FloatField()
    latest_reward = serializers.FloatField(allow_null=True)
    best_val_reward = serializers.FloatField(allow_null=True)
    error = serializers.CharField()
    cancel_requested = serializers.BooleanField()
    pause_requested = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class RunClientOutput(serializers.Serializer):
    class RunClientJobOutput(serializers.Serializer):
        status = serializers.CharField()
        step = serializers.IntegerField(allow_null=True)
        error = serializers.CharField(allow_blank=True)

    model = serializers.CharField(allow_null=True, help_text="entity/project/name; null once the client deleted it.")
    inference_name = serializers.CharField(allow_null=True)
    contacted_at = serializers.DateTimeField(allow_null=True, help_text="The client's last call.")
    jobs = serializers.IntegerField(help_text="Training jobs the client posted.")
    last_job = RunClientJobOutput(allow_null=True)


class RunQueueOutput(serializers.Serializer):
    place = serializers.IntegerField(help_text="1: the next run a GPU worker trains.")
    ahead = serializers.IntegerField(help_text="Runs that go before it.")
    reason = serializers.CharField(help_text="Why it waits, in one line, e.g. the runs that go first and why.")


class RunDetailOutput(RunOutput):
    """context["user"]: who asks (the actions are theirs)."""

    config = serializers.JSONField(help_text="The validated RunConfig, every setting included.")
    worker = serializers.CharField()
    heartbeat_at = serializers.DateTimeField(allow_null=True)
    actions = serializers.SerializerMethodField(
        help_text="What you may do to the run now (cancel, pause, resume, retry): the run page's enabled buttons."
    )
    client = serializers.SerializerMethodField(
        help_text="A client-driven run's ART client: its model's name, the name it samples from, its last call "
        "and its training jobs; null for any other run."
    )

    queue = serializers.SerializerMethodField(
        help_text="The run's place in the fair queue of GPU workers (docs: Scheduling) while it waits for one; "
        "null while a worker trains it, or it is paused, waiting for its client or finished."
    )

    def get_actions(self, run) -> list[str]:
        return services.run_actions(run=run, user=self.context["user"])

    @extend_schema_field(RunClientOutput(allow_null=True))
    def get_client(self, run) -> dict | None:
        summary = selectors.run_client_summary(run=run)
        return None if summary is None else RunClientOutput(summary).data

    @extend_schema_field(RunQueueOutput(allow_null=True))
    def get_queue(self, run) -> dict | None:
        place = run_queue_place(run=run)
        return None if place is None else RunQueueOutput(place).data


def _detail(run: Run, user) -> dict:
    return RunDetailOutput(run, context={"user": user}).data


def _run(user, run_id: int) -> Run:
    return selectors.run_get(user=user, run_id=run_id)


class RunListApi(Api):
    class FilterSerializer(serializers.Serializer):
        status = serializers.ChoiceField(choices=Run.Status.choices, required=False)
        base_model = serializers.CharField(required=False, max_length=200, help_text="Base model id or name.")
        tag = serializers.CharField(required=False, max_length=50)
        q = serializers.CharField(required=False, max_length=200, help_text="Text in the run's or script's name.")
        order = serializers.ChoiceField(choices=selectors.RUN_ORDERS, required=False, default="-created_at")

    @extend_schema(
        operation_id="runs_list",
        parameters=[FilterSerializer, *PAGE_PARAMETERS],
        responses={200: paginated_schema(RunOutput, "PaginatedRunList"), 400: ErrorSerializer},
    )
    def get(self, request):
        filters = query_params(self.FilterSerializer, request)
        qs = selectors.run_list(user=request.user, **filters).select_related("reward_version__asset", "scenario_set")
        return paginated_response(request=request, view=self, queryset=qs, serializer_class=RunOutput)


class RunCreateApi(WriteApi):
    """Create a run and queue it: a GPU worker picks it up and trains."""

    throttle_scope = "runs"

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=200)
        base_model = IdOrNameField(help_text="Base model id or name.")
        script = IdOrNameField(help_text="Rollout script id or name.")
        script_version = serializers.IntegerField(
            required=False, min_value=1, max_value=MAX_INT, help_text="Version number; default the newest."
        )
        reward = IdOrNameField(
            required=False,
            allow_null=True,
            default=None,
            help_text="Reward function id or name; none if the script sets rewards itself.",
        )
        reward_version = serializers.IntegerField(required=False, min_value=1, max_value=MAX_INT)
        scenario_set = IdOrNameField(help_text="Scenario set id or name.")
        config = serializers.DictField(
            required=False, default=dict, help_text="RunConfig settings; missing ones take their defaults."
        )
        tags = serializers.ListField(
            child=serializers.CharField(max_length=50), required=False, default=list, max_length=20
        )

    @extend_schema(operation_id="runs_create", request=InputSerializer, responses={201: RunDetailOutput, **ERRORS})
    def post(self, request):
        data = body(self.InputSerializer, request)
        user = request.user
        run = services.run_create(
            owner=user,
            name=data["name"],
            base_model=resolve_base_model(user, data["base_model"]),
            script_version=resolve_script_version(user, data["script"], data.get("script_version")),
            reward_version=resolve_reward_version(user, data["reward"], data.get("reward_version")),
            scenario_set=resolve_scenario_set(user, data["scenario_set"]),
            config=data["config"],
            tags=data["tags"],
        )
        return Response(_detail(run, user), status=201)


class RunDetailApi(Api):
    @extend_schema(operation_id="runs_retrieve", responses={200: RunDetailOutput, 404: ErrorSerializer})
    def get(self, request, run_id: int):
        return Response(_detail(_run(request.user, run_id), request.user))


class _RunActionApi(WriteApi):
    service = None

    def act(self, request, run_id: int):
        run = _run(request.user, run_id)
        run = type(self).service(run=run, actor=request.user)
        return Response(_detail(run, request.user))


class RunCancelApi(_RunActionApi):
    """Cancel: at once if nothing is executing, else the worker stops at its next check."""

    service = staticmethod(services.run_cancel)

    @extend_schema(operation_id="runs_cancel", request=None, responses={200: RunDetailOutput, **ERRORS})
    def post(self, request, run_id: int):
        return self.act(request, run_id)


class RunPauseApi(_RunActionApi):
    """Pause: at once if queued, else after the current step."""

    service = staticmethod(services.run_pause)

    @extend_schema(operation_id="runs_pause", request=None, responses={200: RunDetailOutput, **ERRORS})
    def post(self, request, run_id: int):
        return self.act(request, run_id)


class RunResumeApi(_RunActionApi):
    service = staticmethod(services.run_resume)

    @extend_schema(operation_id="runs_resume", request=None, responses={200: RunDetailOutput, **ERRORS})
    def post(self, request, run_id: int):
        return self.act(request, run_id)


class RunRetryApi(_RunActionApi):
    """Requeue a failed or cancelled run; it continues from its last checkpoint."""

    service = staticmethod(services.run_retry)

    @extend_schema(operation_id="runs_retry", request=None, responses={200: RunDetailOutput, **ERRORS})
    def post(self, request, run_id: int):
        return self.act(request, run_id)


def _alert_rules_serializer() -> type[serializers.Serializer]:
    """The PATCH body's schema, from AlertRules: every rule optional (the service validates the values)."""
    kinds = {int: serializers.IntegerField, float: serializers.FloatField, bool: serializers.BooleanField}
    fields = {}
    for name, info in AlertRules.model_fields.items():
        field = kinds.get(info.annotation)
        fields[name] = (
            field(required=False, help_text=info.description)
            if field
            else serializers.ListField(child=serializers.CharField(), required=False, help_text=info.description)
        )
    return type("AlertRulesInput", (serializers.Serializer,), fields)


class RunAlertsApi(WriteApi):
    """A run's alert rules (RunConfig.alerts): read them, or change some while the run goes."""

    InputSerializer = _alert_rules_serializer()

    class OutputSerializer(serializers.Serializer):
        alerts = serializers.DictField(help_text="Every rule with its value (AlertRules).")

    @extend_schema(operation_id="runs_alerts_retrieve", responses={200: OutputSerializer, 404: ErrorSerializer})
    def get(self, request, run_id: int):
        run = _run(request.user, run_id)
        return Response({"alerts": alert_rules(run)})

    @extend_schema(
        operation_id="runs_alerts_update", request=InputSerializer, responses={200: OutputSerializer, **ERRORS}
    )
    def patch(self, request, run_id: int):
        run = _run(request.user, run_id)
        rules = run_alert_rules_update(run=run, changes=request.data, actor=request.user)
        return Response({"alerts": rules.model_dump()})


SERIES_NAME = re.compile(r"^[A-Za-z0-9_./-]{1,64}$")


class RunMetricsApi(Api):
    """Per-step metrics as series of (step, value), downsampled on request, newer than a cursor.

    Poll with since_step=<last_step of the previous answer> to get only what is new.
    """

    class FilterSerializer(serializers.Serializer):
        series = serializers.CharField(
            required=False,
            max_length=2000,
            help_text="Comma-separated names (default: the standard charts), e.g. reward_mean,loss,kl.",
        )
        since_step = serializers.IntegerField(
            required=False, min_value=0, max_value=MAX_INT, help_text="Only steps after this one."
        )
        max_points = serializers.IntegerField(
            required=False,
            min_value=0,
            max_value=100_000,
            default=0,
            help_text="Downsample each series to about this many points (min/max per bucket, spikes kept); 0: all.",
        )

        def validate_series(self, value):
            names = [n.strip() for n in value.split(",") if n.strip()]
            bad = [n for n in names if not SERIES_NAME.match(n)]
            if bad:
                raise serializers.ValidationError(f"not a series name: {bad[0][:64]!r}")
            if len(names) > 32:
                raise serializers.ValidationError("at most 32 series at once")
            return names

    class OutputSerializer(serializers.Serializer):
        class PointsSerializer(serializers.Serializer):
            x = serializers.ListField(child=serializers.IntegerField(), help_text="Steps.")
            y = serializers.ListField(child=serializers.FloatField(), help_text="Values at those steps.")

        series = serializers.DictField(child=PointsSerializer(), help_text="By series name.")
        last_step = serializers.IntegerField(allow_null=True, help_text="Pass as since_step next time.")

    @extend_schema(
        operation_id="runs_metrics", parameters=[FilterSerializer], responses={200: OutputSerializer, **ERRORS}
    )
    def get(self, request, run_id: int):
        run = _run(request.user, run_id)
        f = query_params(self.FilterSerializer, request)
        data = selectors.run_metrics(
            run=run, series=f.get("series") or None, since_step=f.get("since_step"), max_points=f["max_points"] or None
        )
        return Response(data)


class RunEventListApi(Api):
    """The run's timeline, oldest first, after an event id (poll with after=<next_after>)."""

    class FilterSerializer(serializers.Serializer):
        after = serializers.IntegerField(required=False, min_value=0, max_value=MAX_ID, default=0)
        limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=200)

    class OutputSerializer(serializers.Serializer):
        class EventSerializer(serializers.Serializer):
            id = serializers.IntegerField()
            kind = serializers.CharField()
            message = serializers.CharField()
            data = serializers.JSONField()
            actor = serializers.CharField(source="actor.username", allow_null=True, default=None)
            created_at = serializers.DateTimeField()

        results = EventSerializer(many=True)
        next_after = serializers.IntegerField()

    @extend_schema(
        operation_id="runs_events", parameters=[FilterSerializer], responses={200: OutputSerializer, **ERRORS}
    )
    def get(self, request, run_id: int):
        run = _run(request.user, run_id)
        f = query_params(self.FilterSerializer, request)
        events = selectors.run_events_since(run=run, after_id=f["after"], limit=f["limit"])
        return Response(
            self.OutputSerializer({"results": events, "next_after": events[-1].id if events else f["after"]}).data
        )


class RunLogListApi(Api):
    """Worker log lines about the run, oldest first, after a log id."""

    class FilterSerializer(serializers.Serializer):
        after = serializers.IntegerField(required=False, min_value=0, max_value=MAX_ID, default=0)
        limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=500)

    class OutputSerializer(serializers.Serializer):
        class LogSerializer(serializers.Serializer):
            id = serializers.IntegerField()
            step = serializers.IntegerField(allow_null=True)
            level = serializers.CharField()
            message = serializers.CharField()
            created_at = serializers.DateTimeField()

        results = LogSerializer(many=True)
        next_after = serializers.IntegerField()

    @extend_schema(operation_id="runs_logs", parameters=[FilterSerializer], responses={200: OutputSerializer, **ERRORS})
    def get(self, request, run_id: int):
        run = _run(request.user, run_id)
        f = query_params(self.FilterSerializer, request)
        logs = selectors.run_logs_since(run=run, after_id=f["after"], limit=f["limit"])
        return Response(
            self.OutputSerializer({"results": logs, "next_after": logs[-1].id if logs else f["after"]}).data
        )
