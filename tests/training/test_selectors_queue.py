"""A run's place in the fair queue and why it waits (training.selectors_queue.run_queue_places), on PostgreSQL
and the Redis where the workers' sweepers mark them alive; and the run detail API's `queue` object."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.utils import timezone

from artweb.testing.factories import RunFactory, StepFactory
from tests.api.conftest import token_client
from training.models import Quota, Run
from training.selectors_queue import QueuePlace, run_queue_place, run_queue_places, waiting_runs
from training.services.steps.fair import step_turn_claim
from training.sweeper import ALIVE_PREFIX, worker_mark

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu_workers():
    """Mark n GPU workers alive, as their sweepers do; none is marked before or after the test."""
    client = redis.Redis.from_url(django_settings.REDIS_URL)

    def clear():
        for key in client.scan_iter(match=f"{ALIVE_PREFIX}*"):
            client.delete(key)

    def mark(n: int) -> None:
        clear()
        for i in range(n):
            worker_mark(client, f"gpu-{i}@test", "gpu")
        worker_mark(client, "default@test", "default")  # a worker of the other queue counts for nothing

    clear()
    yield mark
    clear()
    client.close()


def used(owner, seconds: float) -> None:
    run = RunFactory(owner=owner, status=Run.Status.COMPLETED, finished_at=timezone.now())
    StepFactory(run=run, step=1, duration_s=seconds)


def waiting(owner, *, waited_min: int = 0, **fields) -> Run:
    run = RunFactory(owner=owner, status=fields.pop("status", Run.Status.QUEUED), **fields)
    Run.objects.filter(id=run.id).update(created_at=timezone.now() - timedelta(minutes=waited_min))
    run.refresh_from_db()
    return run


@pytest.fixture
def queue(alice, bob, django_user_model):
    """Bob (60 s of GPU in the last hour) waits with one run, alice (600 s) with two; carol's run is training,
    dave's is paused."""
    carol, dave = django_user_model.objects.create_user("carol"), django_user_model.objects.create_user("dave")
    used(alice, 600)
    used(bob, 60)
    runs = {
        "alice_old": waiting(alice, waited_min=30),
        "alice_new": waiting(alice, waited_min=10),
        "bob": waiting(bob, waited_min=1),
        "carol": waiting(carol, status=Run.Status.RUNNING, worker="gpu-0:1", heartbeat_at=timezone.now()),
        "dave": waiting(dave, status=Run.Status.PAUSED),
    }
    return runs


def test_each_waiting_run_has_its_place_and_the_reason_it_waits(queue, gpu_workers):
    gpu_workers(1)
    places = run_queue_places()
    carol = queue["carol"].id
    assert places == {
        queue["bob"].id: QueuePlace(1, 0, f"next: waiting for a GPU worker to finish run #{carol}'s step"),
        queue["alice_old"].id: QueuePlace(
            2, 1, "2nd in line: 1 run of a user with less GPU time in the last hour goes first"
        ),
        queue["alice_new"].id: QueuePlace(
            3,
            2,
            "3rd in line: 1 run of a user with less GPU time in the last hour and 1 run of the same user waiting "
            "longer go first",
        ),
    }  # carol's run is training, dave's paused: neither waits


def test_the_place_is_the_order_the_workers_pick_in(queue, gpu_workers):
    gpu_workers(1)
    places = run_queue_places()
    assert [w.run_id for w in waiting_runs()] == sorted(places, key=lambda run_id: places[run_id].place)
    # A message of alice's, taken by a worker: bob's run, the first in line, takes the turn.
    assert step_turn_claim(run_id=queue["alice_new"].id, step=None, me="w:9") == queue["bob"].id
    assert run_queue_places()[queue["alice_old"].id].place == 1


def test_without_a_gpu_worker_it_says_so(queue, gpu_workers):
    gpu_workers(0)
    reasons = [p.reason for p in sorted(run_queue_places().values(), key=lambda p: p.place)]
    assert reasons == [
        "next; no GPU worker is running",
        "2nd in line; no GPU worker is running",
        "3rd in line; no GPU worker is running",
    ]


def test_a_free_gpu_worker_takes_the_first_runs_now(queue, gpu_workers):
    gpu_workers(3)  # one trains carol's run: two are free
    reasons = [p.reason for p in sorted(run_queue_places().values(), key=lambda p: p.place)]
    assert reasons[:2] == [
        "next: a GPU worker is free to take it now",
        "2nd in line: a GPU worker is free to take it now",
    ]
    assert reasons[2].startswith("3rd in line: 1 run of a user with less GPU time")


def test_it_says_when_shares_make_the_difference_and_counts_users_at_equal_time(
    alice, bob, django_user_model, gpu_workers, settings
):
    settings.ARTWEB_FAIR_SHARE_HOURS = 2
    erin, frank = django_user_model.objects.create_user("erin"), django_user_model.objects.create_user("frank")
    used(alice, 600)  # for her share of 10: 60
    used(bob, 100)
    Quota.objects.create(user=alice, share_weight=10)
    his, hers = waiting(bob, waited_min=50), waiting(alice, waited_min=40)
    erins, franks = waiting(erin, waited_min=5), waiting(frank, waited_min=1)  # no GPU time: first
    gpu_workers(1)
    places = run_queue_places()
    assert [places[r.id].place for r in (erins, franks, hers, his)] == [1, 2, 3, 4]
    assert (
        places[franks.id].reason == "2nd in line: 1 run of a user with as much GPU time but waiting longer goes first"
    )
    assert places[hers.id].reason == (
        "3rd in line: 2 runs of users with less GPU time for their share in the last 2 hours go first"
    )
    assert places[his.id].reason == (
        "4th in line: 3 runs of users with less GPU time for their share in the last 2 hours go first"
    )


def test_it_reads_a_fixed_number_of_times_whatever_the_number_of_runs(
    alice, bob, gpu_workers, django_assert_max_num_queries
):
    gpu_workers(1)
    for _ in range(2):
        waiting(alice), waiting(bob)
    used(alice, 10)
    with django_assert_max_num_queries(5) as few:
        assert len(run_queue_places()) == 4
    for _ in range(10):
        waiting(alice), waiting(bob)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert len(run_queue_places()) == 24


def test_a_run_that_does_not_wait_has_no_place_and_costs_no_query(queue, django_assert_num_queries):
    for name in ("carol", "dave"):
        with django_assert_num_queries(0):
            assert run_queue_place(run=queue[name]) is None


# --- the run detail API --------------------------------------------------------------------------------------------


def test_the_run_detail_api_shows_the_queue_place_of_a_waiting_run(queue, alice, gpu_workers, settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "queue"}}
    gpu_workers(1)
    api = token_client(alice)
    body = api.get(f"/api/v1/runs/{queue['alice_old'].id}/").json()
    assert body["queue"] == {
        "place": 2,
        "ahead": 1,
        "reason": "2nd in line: 1 run of a user with less GPU time in the last hour goes first",
    }
    Run.objects.filter(id=queue["alice_old"].id).update(status=Run.Status.RUNNING, worker="gpu-0:7")
    assert api.get(f"/api/v1/runs/{queue['alice_old'].id}/").json()["queue"] is None


def test_the_schema_describes_the_queue_object():
    from drf_spectacular.generators import SchemaGenerator

    components = SchemaGenerator().get_schema(public=True)["components"]["schemas"]
    queue = components["RunDetailOutput"]["properties"]["queue"]
    assert queue.get("nullable") is True and queue["readOnly"] is True
    ref = queue["allOf"][0]["$ref"] if "allOf" in queue else queue["$ref"]
    assert set(components[ref.rsplit("/", 1)[1]]["properties"]) == {"place", "ahead", "reason"}
