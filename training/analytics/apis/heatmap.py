"""The scenario × step heatmap of a run (the same payload the heatmap page draws)."""

from __future__ import annotations

from django.utils.decorators import method_decorator
from django.views.decorators.gzip import gzip_page
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import Api, query_params
from artweb.api_errors import ErrorSerializer
from training import selectors
from training.analytics.heatmap import (
    COLUMNS_LIMIT,
    MAX_COLUMNS,
    MAX_STEP,
    heatmap_etag,
    heatmap_query,
    run_heatmap,
    run_heatmap_version,
)
from training.models import TrajectoryGroup


@method_decorator(gzip_page, name="dispatch")  # mostly base64: gzip shrinks it about 5-fold
class RunHeatmapApi(Api):
    """One row per scenario, one column per step (consecutive steps binned past max_columns), each cell
    the mean reward of that scenario's groups there; failed attempts are left out, empty cells stay empty.

    `values.data` is base64 of rows × columns bytes, row-major: byte q < 255 means
    values.min + q × (values.max − values.min) / values.levels, and 255 no group. `counts.data` holds the
    number of groups of each non-empty cell (capped at 255), one byte each, in the same order.
    Give from/to to zoom in.

    Answers carry an ETag: send it back in If-None-Match and an unchanged view answers 304 without a body.
    """

    class FilterSerializer(serializers.Serializer):
        split = serializers.ChoiceField(choices=TrajectoryGroup.Split.choices, required=False, default="train")
        # "from" is a Python keyword: the field is declared below under its query-string name.
        to = serializers.IntegerField(
            required=False, min_value=0, max_value=MAX_STEP, help_text="Last step shown (included)."
        )
        max_columns = serializers.IntegerField(
            required=False,
            min_value=1,
            max_value=COLUMNS_LIMIT,
            default=MAX_COLUMNS,
            help_text="Bin consecutive steps when there are more steps.",
        )

        def get_fields(self):
            fields = super().get_fields()
            fields["from"] = serializers.IntegerField(
                required=False, min_value=0, max_value=MAX_STEP, help_text="First step shown (included)."
            )
            return fields

    class OutputSerializer(serializers.Serializer):
        class ColumnsSerializer(serializers.Serializer):
            first_step = serializers.ListField(child=serializers.IntegerField())
            last_step = serializers.ListField(child=serializers.IntegerField())

        class RowsSerializer(serializers.Serializer):
            scenario = serializers.ListField(child=serializers.IntegerField(), help_text="Scenario ids.")
            index = serializers.ListField(child=serializers.IntegerField(), help_text="Scenario indexes.")
            text = serializers.ListField(
                child=serializers.CharField(allow_blank=True), help_text="The start of each scenario's JSON."
            )

        class ValuesSerializer(serializers.Serializer):
            min = serializers.FloatField()
            max = serializers.FloatField()
            levels = serializers.IntegerField()
            empty = serializers.IntegerField()
            data = serializers.CharField(help_text="base64, rows × columns bytes.")

        class CountsSerializer(serializers.Serializer):
            data = serializers.CharField(help_text="base64, one byte per non-empty cell: its groups.")

        run = serializers.IntegerField()
        split = serializers.CharField()
        step_from = serializers.IntegerField(allow_null=True)
        step_to = serializers.IntegerField(allow_null=True)
        steps = serializers.IntegerField(help_text="Steps with groups in the view.")
        binned = serializers.BooleanField(help_text="Whether columns hold more than one step.")
        steps_per_column = serializers.IntegerField()
        columns = ColumnsSerializer()
        rows = RowsSerializer()
        values = ValuesSerializer()
        counts = CountsSerializer()
        last_group = serializers.IntegerField(help_text="The run's newest group id the cells include.")
        version = serializers.CharField(help_text="Changes whenever the cells may have.")

    @extend_schema(
        operation_id="runs_heatmap",
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, 400: ErrorSerializer, 404: ErrorSerializer},
    )
    def get(self, request, run_id: int):
        run = selectors.run_get(user=request.user, run_id=run_id)
        f = query_params(self.FilterSerializer, request)
        query = heatmap_query(
            split=f["split"], step_from=f.get("from"), step_to=f.get("to"), max_columns=f["max_columns"]
        )
        if request.headers.get("If-None-Match") == heatmap_etag(query, run_heatmap_version(run=run)):
            return Response(status=304, headers={"ETag": request.headers["If-None-Match"]})
        data = run_heatmap(run=run, query=query)
        return Response(
            data, headers={"ETag": heatmap_etag(query, data["version"]), "Cache-Control": "private, no-cache"}
        )
