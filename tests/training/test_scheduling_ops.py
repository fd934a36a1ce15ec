"""What operators and users see of the GPU workers' sharing: the admin's Scheduling page and /metrics (GPU time
per user, the fair queue and its waits, the runs each worker holds), and a waiting run's place, on its page
and the runs list, first paint and live (real Redis channel layer, real ASGI application)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.utils import timezone

from artweb.testing.factories import RunFactory, StepFactory
from tests.metrics.test_metrics import scrape
from tests.training.test_consumers import _connect
from tests.training.test_selectors_queue import gpu_workers  # noqa: F401
from training.models import Run, Step
from training.services import run_transition
from training.services.broadcast import queue_send
from training.services.trainer_pool import HELD_KEY


@pytest.fixture
def sharing(alice, bob, django_user_model, gpu_workers):  # noqa: F811
    """alice trains on worker gpu-1:42 (two steps recorded: 30 s and 12.5 s); bob and carol each wait with a
    queued run; the worker published that it keeps alice's run and another's state."""
    gpu_workers(0)  # none marked alive (a worker of another test may have marked itself in this Redis)
    carol = django_user_model.objects.create_user("carol", "carol@example.com", "carol-pass-123")
    now = timezone.now()
    training = RunFactory(owner=alice, status="running", steps_done=2, worker="gpu-1:42", heartbeat_at=now)
    Run.objects.filter(id=training.id).update(created_at=now - timedelta(seconds=200))
    for step, ago, seconds in ((1, 100, 30.0), (2, 50, 12.5)):
        row = StepFactory(run=training, step=step, duration_s=seconds)
        Step.objects.filter(id=row.id).update(created_at=now - timedelta(seconds=ago))
    bobs = RunFactory(owner=bob, status="queued")
    carols = RunFactory(owner=carol, status="queued")
    Run.objects.filter(id=bobs.id).update(created_at=now - timedelta(seconds=90))
    Run.objects.filter(id=carols.id).update(created_at=now - timedelta(seconds=30))
    cache.set(HELD_KEY, {"gpu-1:42": {"runs": [training.id, 999], "at": now.timestamp()}})
    yield {"training": training, "bob": bobs, "carol": carols}
    cache.delete(HELD_KEY)


def test_metrics_show_gpu_time_the_queue_its_waits_and_the_runs_each_worker_holds(client, staff, sharing):
    client.force_login(staff)
    m = scrape(client)
    alice_id = str(sharing["training"].owner_id)
    assert m[("artweb_user_gpu_seconds_fair_share_window", (("user_id", alice_id),))] == pytest.approx(42.5)
    assert m[("artweb_queue_waiting_runs", ())] == 2
    assert 90 <= m[("artweb_queue_oldest_wait_seconds", ())] < 150  # bob's, queued 90 s ago
    # Step 1 started 130 s ago, 70 s after its run's creation; step 2 started 62.5 s ago, 37.5 s after step 1.
    assert m[("artweb_step_wait_seconds_1h", (("stat", "mean"),))] == pytest.approx(53.75, abs=0.1)
    assert m[("artweb_step_wait_seconds_1h", (("stat", "max"),))] == pytest.approx(70.0, abs=0.1)
    assert m[("artweb_worker_runs_held", (("worker", "gpu-1:42"),))] == 2


def test_the_scheduling_page_is_for_staff_and_shows_the_queue_in_order(client, alice, staff, sharing):
    client.force_login(alice)
    response = client.get("/admin/scheduling/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]

    client.force_login(staff)
    page = client.get("/admin/scheduling/").content.decode()
    bob_run, carol_run = sharing["bob"], sharing["carol"]
    # bob and carol have used no GPU time: bob's run, waiting longer, goes first.
    assert page.index(f"#{bob_run.id} {bob_run.name}") < page.index(f"#{carol_run.id} {carol_run.name}")
    assert "no GPU worker is running" in page  # none marked itself alive here
    assert "gpu-1:42" in page and f"run #{sharing['training'].id}" in page
    assert "42" in page and "alice" in page
    assert client.get("/admin/").content.decode().count('href="/admin/scheduling/"') == 1  # linked from the admin


def test_a_waiting_runs_place_is_on_its_page_and_in_the_runs_list(client, bob, sharing):
    client.force_login(bob)
    page = client.get(f"/runs/{sharing['bob'].id}/").content.decode()
    assert 'id="run-queue" role="status" >' in page or 'id="run-queue" role="status">' in page  # shown, not hidden
    assert "In the queue, <span data-queue-reason>next; no GPU worker is running</span>" in page
    listing = client.get("/").content.decode()
    assert 'title="next; no GPU worker is running">#1 in queue</span>' in listing


@pytest.mark.django_db(transaction=True)
async def test_a_waiting_run_hears_its_place_move_live_and_that_it_left_the_queue(alice, bob, django_user_model):
    now = timezone.now()
    bobs = await sync_to_async(RunFactory)(owner=bob, status="queued")
    alices = await sync_to_async(RunFactory)(owner=alice, status="queued")
    await sync_to_async(Run.objects.filter(id=alices.id).update)(created_at=now - timedelta(minutes=5))
    page, connected, _ = await _connect(f"/ws/runs/{bobs.id}/", bob)
    assert connected
    listing, connected, _ = await _connect("/ws/runs/", bob)
    assert connected

    # alice's run, waiting longer, goes first; pausing it moves bob's run to first place.
    await sync_to_async(run_transition)(
        run=alices, from_statuses=(Run.Status.QUEUED,), to_status=Run.Status.PAUSED, message="paused"
    )
    heard = await _until_queue(page, bobs.id)
    assert heard["place"] == 1 and heard["reason"].startswith("next")
    assert (await _until_queue(listing, bobs.id))["place"] == 1

    # A worker claims bob's run: its page hears that it left the queue.
    await sync_to_async(Run.objects.filter(id=bobs.id).update)(worker="gpu-1:7", heartbeat_at=now)
    await sync_to_async(queue_send)(left=(bobs.id,))
    heard = await _until_queue(page, bobs.id)
    assert heard["place"] is None and heard["reason"] == ""
    await page.disconnect()
    await listing.disconnect()


async def _until_queue(comm, run_id: int) -> dict:
    """The next queue message about run_id (status and row messages come with it)."""
    for _ in range(20):
        msg = await comm.receive_json_from(timeout=5)
        if msg.get("type") == "queue" and msg.get("run") == run_id:
            return msg
    raise AssertionError(f"no queue message about run {run_id}")
