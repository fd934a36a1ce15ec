"""The scenario × step heatmap: the matrix PostgreSQL computes, its packing, binning and zoom, the
inspector's scenario filter it links to, and the API (owner-scoped, clear errors, conditional GETs)."""

import base64
import math

import pytest
from django.urls import reverse

from artweb.testing.factories import RunFactory, TrajectoryFactory
from rollouts.models import Scenario
from tests.api.conftest import assert_error, token_client
from training.analytics.heatmap import (
    EMPTY,
    LEVELS,
    HeatmapQuery,
    heatmap_columns_record,
    heatmap_decode,
    heatmap_query,
    run_heatmap,
)
from training.models import HeatmapColumn, TrajectoryGroup

pytestmark = pytest.mark.django_db


def group(run, step, scenario_index, reward, *, split="train", failed=False):
    scenario = Scenario.objects.get(scenario_set=run.scenario_set, index=scenario_index)
    return TrajectoryGroup.objects.create(
        run=run, step=step, split=split, scenario=scenario, reward_mean=reward, failed_attempt=failed
    )


@pytest.fixture
def run(alice):
    """Scenarios 0-3 train, 4-5 validation. Train groups (step: {scenario: rewards of its groups}):
    1: {0: [0.0], 2: [0.5]}, 2: {0: [1.0, 0.5]}, 3: {2: [0.25], 3: [1.0]}, and a failed attempt at step 3
    for scenario 1 (reward 0.9) that must not count; scenario 1 has no other group, so no row.
    Validation: step 2: {4: 0.75}."""
    run = RunFactory(owner=alice)
    group(run, 1, 0, 0.0)
    group(run, 1, 2, 0.5)
    group(run, 2, 0, 1.0)
    group(run, 2, 0, 0.5)
    group(run, 3, 2, 0.25)
    group(run, 3, 3, 1.0)
    group(run, 3, 1, 0.9, failed=True)
    group(run, 2, 4, 0.75, split="validation")
    return run


# The packing keeps 255 levels: a decoded value is within half a level of the true mean.
HALF_LEVEL = 1 / (2 * LEVELS)


def matrix(payload):
    """(values, counts) as lists; values within HALF_LEVEL × the reward range compare equal to the truth."""
    values, counts = heatmap_decode(payload)
    tolerance = HALF_LEVEL * (payload["values"]["max"] - payload["values"]["min"]) + 1e-9
    return [
        [None if math.isnan(v) else pytest.approx(float(v), abs=tolerance) for v in row] for row in values
    ], counts.tolist()


def test_it_puts_each_scenarios_mean_reward_per_step_and_leaves_other_cells_empty(run):
    payload = run_heatmap(run=run, query=HeatmapQuery())
    assert payload["rows"]["index"] == [0, 2, 3]  # scenario 1 had only a failed attempt
    assert payload["rows"]["text"][0] == '{"answer": "w0", "prompt": "Say the word w0."}'
    assert payload["columns"] == {"first_step": [1, 2, 3], "last_step": [1, 2, 3]}
    assert payload["binned"] is False and payload["steps"] == 3 and payload["steps_per_column"] == 1
    values, counts = matrix(payload)
    assert values == [
        [0.0, 0.75, None],  # step 2: two groups, (1.0 + 0.5) / 2
        [0.5, None, 0.25],
        [None, None, 1.0],
    ]
    assert counts == [[1, 2, 0], [1, 0, 1], [0, 0, 1]]
    assert payload["values"]["min"] == 0.0 and payload["values"]["max"] == 1.0
    assert payload["last_group"] == TrajectoryGroup.objects.filter(run=run).latest("id").id


def test_it_packs_the_cells_as_bytes_with_255_for_empty(run):
    payload = run_heatmap(run=run, query=HeatmapQuery())
    raw = list(base64.b64decode(payload["values"]["data"]))
    # (v - min) / (max - min) × 254, rounded; row-major.
    assert raw == [0, round(0.75 * LEVELS), EMPTY, 127, EMPTY, round(0.25 * LEVELS), EMPTY, EMPTY, LEVELS]


def test_it_shows_validation_groups_in_a_view_of_their_own(run):
    payload = run_heatmap(run=run, query=HeatmapQuery(split="validation"))
    assert payload["rows"]["index"] == [4] and payload["columns"]["first_step"] == [2]
    assert matrix(payload)[0] == [[0.75]]


def test_it_bins_consecutive_steps_past_the_column_limit_and_says_so(alice):
    run = RunFactory(owner=alice)
    # Scenario 0 at every step 1..10 with reward step/10; scenario 1 only at step 7.
    for step in range(1, 11):
        group(run, step, 0, step / 10)
    group(run, 7, 1, 0.0)
    payload = run_heatmap(run=run, query=HeatmapQuery(max_columns=4))
    # 10 steps into 4 columns: 2, 3, 2, 3 steps.
    assert payload["columns"] == {"first_step": [1, 3, 6, 8], "last_step": [2, 5, 7, 10]}
    assert payload["binned"] is True and payload["steps_per_column"] == 3
    values, counts = matrix(payload)
    assert values[0] == [0.15, 0.4, 0.65, 0.9] and counts[0] == [2, 3, 2, 3]
    assert values[1] == [None, None, 0.0, None] and counts[1] == [0, 0, 1, 0]


def test_it_zooms_into_a_step_range_at_full_resolution(alice):
    run = RunFactory(owner=alice)
    for step in range(1, 11):
        group(run, step, 0, step / 10)
    payload = run_heatmap(run=run, query=HeatmapQuery(step_from=4, step_to=6, max_columns=4))
    assert payload["columns"]["first_step"] == [4, 5, 6] and payload["binned"] is False
    assert matrix(payload)[0] == [[0.4, 0.5, 0.6]]


def test_it_answers_an_empty_matrix_for_a_run_without_groups(alice):
    payload = run_heatmap(run=RunFactory(owner=alice), query=HeatmapQuery())
    assert payload["rows"]["index"] == [] and payload["columns"]["first_step"] == [] and payload["steps"] == 0
    assert payload["values"]["data"] == "" and payload["last_group"] == 0


def test_it_leaves_out_groups_without_a_finite_mean(alice):
    run = RunFactory(owner=alice)
    group(run, 1, 0, None)  # every rollout errored
    group(run, 1, 1, float("nan"))
    group(run, 2, 0, 0.5)
    payload = run_heatmap(run=run, query=HeatmapQuery())
    assert payload["rows"]["index"] == [0] and payload["columns"]["first_step"] == [2]


def test_it_gives_every_cell_the_one_value_when_all_rewards_are_equal(alice):
    run = RunFactory(owner=alice)
    group(run, 1, 0, 0.5)
    group(run, 2, 1, 0.5)
    assert matrix(run_heatmap(run=run, query=HeatmapQuery()))[0] == [[0.5, None], [None, 0.5]]


def test_it_reads_the_matrix_in_two_queries_however_many_groups(alice, django_assert_num_queries):
    run = RunFactory(owner=alice)
    TrajectoryGroup.objects.bulk_create(
        [
            TrajectoryGroup(run=run, step=s, scenario=sc, reward_mean=(s % 7) / 7)
            for s in range(1, 301)
            for sc in run.scenario_set.scenarios.filter(split="train")
        ]
    )
    with django_assert_num_queries(2):  # the cells with their cursor, the scenarios' index and text
        payload = run_heatmap(run=run, query=HeatmapQuery(max_columns=100))
    assert payload["binned"] and len(payload["columns"]["first_step"]) == 100
    assert heatmap_decode(payload)[1].sum() == 1200


def comparable(payload):
    """A payload without its cursor fields, which do not depend on how the cells were read."""
    return {k: v for k, v in payload.items() if k not in ("last_group", "version")}


@pytest.mark.parametrize("query", [HeatmapQuery(), HeatmapQuery(split="validation"), HeatmapQuery(max_columns=2)])
def test_committed_steps_columns_give_the_same_cells_as_their_groups(run, query):
    from_groups = run_heatmap(run=run, query=query)
    for step in (1, 2, 3):
        heatmap_columns_record(run_id=run.id, step=step)
    assert HeatmapColumn.objects.filter(run=run).count() == 4  # train at steps 1-3, validation at step 2
    assert comparable(run_heatmap(run=run, query=query)) == comparable(from_groups)
    assert matrix(run_heatmap(run=run, query=query)) == matrix(from_groups)


def test_the_step_in_progress_is_read_from_its_groups_beside_the_committed_columns(run):
    heatmap_columns_record(run_id=run.id, step=1)
    heatmap_columns_record(run_id=run.id, step=2)
    # Step 3 is not committed: its groups (and a new one arriving) count from the groups table.
    group(run, 3, 0, 0.75)
    values, counts = matrix(run_heatmap(run=run, query=HeatmapQuery()))
    assert values == [[0.0, 0.75, 0.75], [0.5, None, 0.25], [None, None, 1.0]]
    assert counts == [[1, 2, 1], [1, 0, 1], [0, 0, 1]]
    # A committed column is what is read for its step: groups of that step are no longer averaged.
    assert HeatmapColumn.objects.filter(run=run, step__lte=2, split="train").count() == 2


def test_recording_a_step_again_replaces_its_columns(run):
    heatmap_columns_record(run_id=run.id, step=2)
    group(run, 2, 1, 0.0)
    heatmap_columns_record(run_id=run.id, step=2)
    (column,) = HeatmapColumn.objects.filter(run=run, step=2, split="train")
    assert len(bytes(column.cells)) == 2 * 16  # scenarios 0 and 1


def test_the_migration_fills_in_the_columns_of_steps_committed_before_it(run):
    import importlib

    from django.apps import apps
    from django.db import connection

    from training.models import Step

    for step in (1, 2):  # committed; step 3 is still in progress
        Step.objects.create(run=run, step=step)
    expected = run_heatmap(run=run, query=HeatmapQuery())
    migration = importlib.import_module("training.migrations.0009_heatmap_column")
    migration.backfill(apps, type("SchemaEditor", (), {"connection": connection})())
    assert sorted(HeatmapColumn.objects.filter(run=run).values_list("split", "step")) == [
        ("train", 1),
        ("train", 2),
        ("validation", 2),
    ]
    assert comparable(run_heatmap(run=run, query=HeatmapQuery())) == comparable(expected)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"split": "test"}, "split"),
        ({"step_from": 5, "step_to": 4}, "to"),
        ({"max_columns": 0}, "max_columns"),
        ({"step_from": -1}, "from"),
    ],
)
def test_it_refuses_a_view_that_cannot_be_shown_and_says_what_to_change(kwargs, field):
    from artweb.errors import ApplicationError

    with pytest.raises(ApplicationError) as exc:
        heatmap_query(**kwargs)
    assert field in exc.value.field_errors


# --- the API ---------------------------------------------------------------------------------------


@pytest.fixture
def alice_api(alice):
    return token_client(alice)


def test_the_api_answers_the_same_payload_for_the_owner(alice_api, run):
    response = alice_api.get(f"/api/v1/runs/{run.id}/heatmap/?split=train")
    assert response.status_code == 200
    assert response.json() == run_heatmap(run=run, query=HeatmapQuery())
    zoomed = alice_api.get(f"/api/v1/runs/{run.id}/heatmap/?from=2&to=3").json()
    assert zoomed["columns"]["first_step"] == [2, 3] and zoomed["rows"]["index"] == [0, 2, 3]


def test_the_api_hides_another_users_run_and_refuses_strangers(bob, run):
    response = token_client(bob).get(f"/api/v1/runs/{run.id}/heatmap/")
    assert_error(response, 404)
    from rest_framework.test import APIClient

    assert APIClient().get(f"/api/v1/runs/{run.id}/heatmap/").status_code in (401, 403)


def test_staff_see_any_run(staff, run):
    assert token_client(staff).get(f"/api/v1/runs/{run.id}/heatmap/").json()["rows"]["index"] == [0, 2, 3]


@pytest.mark.parametrize(
    "query, field",
    [
        ("split=test", "split"),
        ("from=abc", "from"),
        ("from=5&to=4", "to"),
        ("max_columns=0", "max_columns"),
        ("to=-1", "to"),
        ("max_columns=100000", "max_columns"),
    ],
)
def test_the_api_says_what_to_fix_in_a_bad_query(alice_api, run, query, field):
    assert_error(alice_api.get(f"/api/v1/runs/{run.id}/heatmap/?{query}"), 400, field=field)


def test_the_api_answers_304_until_a_group_arrives_or_an_attempt_fails(alice_api, run):
    url = f"/api/v1/runs/{run.id}/heatmap/"
    etag = alice_api.get(url)["ETag"]
    assert alice_api.get(url, HTTP_IF_NONE_MATCH=etag).status_code == 304
    assert alice_api.get(url + "?split=validation", HTTP_IF_NONE_MATCH=etag).status_code == 200  # another view

    TrajectoryGroup.objects.filter(run=run, step=3, scenario__index=3).update(failed_attempt=True)
    changed = alice_api.get(url, HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed.json()["rows"]["index"] == [0, 2]

    etag = changed["ETag"]
    group(run, 4, 3, 0.0)
    assert alice_api.get(url, HTTP_IF_NONE_MATCH=etag).json()["columns"]["first_step"] == [1, 2, 3, 4]


# --- the page and the inspector it links to --------------------------------------------------------


def test_the_page_embeds_the_payload_and_refuses_a_backwards_range(client, alice, run):
    client.force_login(alice)
    url = reverse("run-heatmap", args=[run.id])
    body = client.get(url).content.decode()
    assert 'id="heatmap-data"' in body and "3 scenarios ×" in body and "3 steps" in body
    bad = client.get(url + "?from=9&to=2").content.decode()
    assert "The step range is empty: &#x27;from&#x27; (9) is after &#x27;to&#x27; (2)" in bad
    assert 'id="heatmap-data"' not in bad
    assert "Enter a whole number" in client.get(url + "?from=x").content.decode()


def test_the_page_of_another_users_run_is_not_found(client, bob, run):
    client.force_login(bob)
    assert client.get(reverse("run-heatmap", args=[run.id])).status_code == 404


def test_the_inspector_shows_only_the_scenario_asked_for(client, alice, run):
    wanted = TrajectoryGroup.objects.get(run=run, step=1, scenario__index=2)
    other = TrajectoryGroup.objects.get(run=run, step=1, scenario__index=0)
    TrajectoryFactory(group=wanted, index=0, reward=0.5)
    TrajectoryFactory(group=other, index=0, reward=0.0)
    client.force_login(alice)
    url = reverse("run-trajectories", args=[run.id])
    body = client.get(url + "?step=1&split=train&scenario=2").content.decode()
    assert "Scenario 2" in body and "Scenario 0" not in body
    assert body.count('class="group"') == 1
    assert client.get(url + "?step=1").content.decode().count('class="group"') == 2
    everywhere = client.get(url + "?all_steps=on&scenario=0").content.decode()
    assert "first 1)" in everywhere


def test_it_finds_each_cells_row_whether_scenario_ids_are_dense_or_scattered():
    import numpy as np

    from training.analytics.heatmap import _distinct

    ids = np.array([7, 3, 7, 10**9, 3], dtype=np.int64)  # a range far wider than the cells: numpy's sort
    distinct, position = _distinct(ids)
    assert distinct.tolist() == [3, 7, 10**9] and distinct[position].tolist() == ids.tolist()
    dense = np.array([12, 10, 12, 11], dtype=np.int64)
    distinct, position = _distinct(dense)
    assert distinct.tolist() == [10, 11, 12] and distinct[position].tolist() == dense.tolist()
