"""The fair queue of training steps: which waiting run a GPU worker's turn goes to (training.services.steps.fair,
training.selectors_queue).

The order and the claims run on PostgreSQL; the race runs two claims in two threads with connections of their
own. The last tests run run_step_execute as a GPU worker calls it, message after message, with
test_step_service's stand-ins for the vLLM server and the trainer (see its docstring): the messages a step sends
are recorded there, and the loop here delivers them in order, as the "gpu" queue would to one worker. The
same with a real Celery worker process and inference server is tests/e2e/test_fair_queue_e2e.py.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.utils import timezone

from artweb.testing.factories import RunFactory, StepFactory
from tests.training.services import test_step_service
from tests.training.services.test_step_service import make_run
from training import selectors_queue
from training.models import Quota, Run, Step
from training.selectors_queue import waiting_runs
from training.services.runs import RUN_JOBS
from training.services.steps import run_step_execute
from training.services.steps.fair import step_turn_claim

world = test_step_service.world  # the step tests' fixture: stand-ins for the vLLM server and the trainer


def used(owner, seconds: float, *, ago=timedelta(minutes=10)) -> None:
    """`owner` used `seconds` of GPU time `ago` (one recorded step of a finished run of theirs)."""
    run = RunFactory(owner=owner, status=Run.Status.COMPLETED, finished_at=timezone.now())
    step = StepFactory(run=run, step=1, duration_s=seconds)
    Step.objects.filter(id=step.id).update(created_at=timezone.now() - ago)


def waiting(owner, *, waited=timedelta(0), status=Run.Status.QUEUED, **fields) -> Run:
    """A run of `owner` waiting for a turn since `waited` ago (created then)."""
    run = RunFactory(owner=owner, status=status, **fields)
    Run.objects.filter(id=run.id).update(created_at=timezone.now() - waited)
    run.refresh_from_db()
    return run


def order(prefer=None) -> list[int]:
    return [w.run_id for w in waiting_runs(prefer=prefer)]


# --- the order ------------------------------------------------------------------------------------------------


def test_it_puts_first_the_runs_of_the_user_with_the_least_recent_gpu_time(django_user_model):
    alice, bob, carol, dave = (django_user_model.objects.create_user(n) for n in ("alice", "bob", "carol", "dave"))
    used(alice, 600)
    used(bob, 100)
    used(carol, 300)
    used(dave, 5000, ago=timedelta(hours=2))  # older than ARTWEB_FAIR_SHARE_HOURS (1): not counted
    a1, a2 = waiting(alice, waited=timedelta(minutes=30)), waiting(alice, waited=timedelta(minutes=20))
    b, c, d = waiting(bob), waiting(carol), waiting(dave)
    assert order() == [d.id, b.id, c.id, a1.id, a2.id]
    seconds = {w.run_id: w.gpu_seconds for w in waiting_runs()}
    assert (seconds[d.id], seconds[b.id], seconds[a2.id]) == (0.0, 100.0, 600.0)


def test_it_divides_the_time_by_the_share_weight_of_the_user_or_their_largest_group(django_user_model, settings):
    alice, bob, carol = (django_user_model.objects.create_user(n) for n in ("alice", "bob", "carol"))
    used(alice, 600)  # weight 4 (her own row, over her group's 10): 150
    used(bob, 400)  # weight 2, the larger of his two groups': 200
    used(carol, 100)  # weight 1: 100
    small, large = Group.objects.create(name="small"), Group.objects.create(name="large")
    alice.groups.add(large)
    bob.groups.add(small, large)
    Quota.objects.create(group=small, share_weight=1.5)
    Quota.objects.create(group=large, share_weight=2)
    Quota.objects.create(group=Group.objects.create(name="limits only"), steps_per_day=10)  # sets no weight
    Quota.objects.create(user=alice, share_weight=4)
    a, b, c = waiting(alice), waiting(bob), waiting(carol)
    assert order() == [c.id, a.id, b.id]
    assert {w.run_id: w.weight for w in waiting_runs()} == {a.id: 4.0, b.id: 2.0, c.id: 1.0}

    settings.ARTWEB_FAIR_SHARE_HOURS = 0.1  # six minutes: the steps ten minutes old no longer count
    assert order() == [a.id, b.id, c.id]  # all at 0: the oldest first


def test_at_equal_time_the_messages_own_run_then_the_longest_waiting(alice, bob):
    used(alice, 60)
    used(bob, 60)
    new = waiting(alice, waited=timedelta(minutes=1))
    old = waiting(bob, waited=timedelta(minutes=9))
    stepped = waiting(alice, waited=timedelta(minutes=30), status=Run.Status.RUNNING, steps_done=1)
    last = StepFactory(run=stepped, step=1)  # its last step was recorded 5 minutes ago: waiting since then
    Step.objects.filter(id=last.id).update(created_at=timezone.now() - timedelta(minutes=5))
    resumed = waiting(bob, waited=timedelta(hours=3), status=Run.Status.QUEUED)
    Run.objects.filter(id=resumed.id).update(dispatched_at=timezone.now() - timedelta(minutes=3))  # queued again
    assert order() == [old.id, stepped.id, resumed.id, new.id]
    assert order(prefer=new.id) == [new.id, old.id, stepped.id, resumed.id]


def test_only_active_runs_whose_lease_is_free_wait(alice, bob):
    queued, starting = waiting(alice), waiting(alice, status=Run.Status.STARTING)
    running = waiting(alice, status=Run.Status.RUNNING, steps_done=2)
    waiting(alice, status=Run.Status.RUNNING, worker="elsewhere:1", heartbeat_at=timezone.now())  # training
    for status in (Run.Status.PAUSED, Run.Status.WAITING, Run.Status.COMPLETED, Run.Status.FAILED):
        waiting(bob, status=status)
    assert set(order()) == {queued.id, starting.id, running.id}
    assert set(Run.ACTIVE_STATUSES) == set(RUN_JOBS.claimable)  # the statuses a step claims a run in


# --- the claim ------------------------------------------------------------------------------------------------


def test_a_turn_goes_to_the_first_waiting_run_and_the_step_it_names_to_its_own_run_only(alice, bob):
    used(alice, 600)
    mine = waiting(alice, status=Run.Status.RUNNING, steps_done=3)
    bobs = waiting(bob)
    assert step_turn_claim(run_id=mine.id, step=4, me="w:1") == bobs.id
    assert Run.objects.get(id=bobs.id).worker == "w:1" and Run.objects.get(id=mine.id).worker == ""

    # Bob's run held: alice's own run takes the turn at the step it names.
    assert step_turn_claim(run_id=mine.id, step=4, me="w:2") == mine.id


def test_a_message_whose_step_is_done_passes_the_turn_to_another_waiting_run(alice, bob):
    """The turn of a message spent on another run comes back as that run's own message, whose step is then
    done: it goes to the run whose message was spent, never lost (else that run would wait for ever)."""
    done = waiting(alice, status=Run.Status.RUNNING, steps_done=3)
    assert step_turn_claim(run_id=done.id, step=3, me="w:1") is None  # alone: a duplicate does nothing
    assert Run.objects.get(id=done.id).worker == ""
    other = waiting(bob)
    assert step_turn_claim(run_id=done.id, step=3, me="w:1") == other.id
    assert Run.objects.get(id=done.id).worker == ""


def test_a_message_of_a_paused_or_finished_run_is_a_turn_for_a_waiting_one(alice, bob):
    paused, cancelled = waiting(alice, status=Run.Status.PAUSED), waiting(alice, status=Run.Status.CANCELLED)
    queued = waiting(bob)
    assert step_turn_claim(run_id=paused.id, step=None, me="w:1") == queued.id
    assert step_turn_claim(run_id=cancelled.id, step=None, me="w:2") is None  # none left waiting


def test_the_messages_own_run_left_by_a_dead_worker_is_taken_over(alice, bob):
    """A worker that stopped heartbeating (or a pool child killed mid-step, whose message comes back at
    once): its message's own run is claimed over its lease (run_claim), ahead of the others at equal time."""
    other = waiting(bob, waited=timedelta(hours=1))
    mine = waiting(alice, status=Run.Status.RUNNING, worker="elsewhere:1", heartbeat_at=timezone.now())
    Run.objects.filter(id=mine.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))  # stale lease
    assert step_turn_claim(run_id=mine.id, step=1, me="w:1") == mine.id
    assert step_turn_claim(run_id=mine.id, step=1, me="w:2") == other.id  # mine is live again: held


@pytest.mark.django_db(transaction=True)
def test_two_workers_picking_the_same_run_the_loser_takes_the_next(alice, bob, monkeypatch):
    """Both workers read the queue before either claims (a barrier holds them there): both try bob's run
    first; one gets it, the other the next run, and no run is claimed twice."""
    used(alice, 600)
    first, second = waiting(bob), waiting(alice)
    barrier = threading.Barrier(2, timeout=10)
    real = selectors_queue.waiting_runs

    def read_then_wait(**kwargs):
        runs = real(**kwargs)
        barrier.wait()
        return runs

    monkeypatch.setattr("training.services.steps.fair.waiting_runs", read_then_wait)
    got: dict[str, int | None] = {}

    def worker(me: str, message_run: int) -> None:
        try:
            got[me] = step_turn_claim(run_id=message_run, step=None, me=me)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=worker, args=("w:1", second.id)),
        threading.Thread(target=worker, args=("w:2", first.id)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(got.values()) == sorted([first.id, second.id])
    holders = dict(Run.objects.filter(id__in=[first.id, second.id]).values_list("id", "worker"))
    assert {worker: run_id for run_id, worker in holders.items()} == got  # each run leased to who claimed it


@pytest.mark.django_db(transaction=True)
def test_more_workers_than_waiting_runs_claim_each_run_once(alice, bob, monkeypatch):
    runs = [waiting(alice), waiting(bob), waiting(alice)]
    barrier = threading.Barrier(5, timeout=10)
    real = selectors_queue.waiting_runs

    def read_then_wait(**kwargs):
        runs_read = real(**kwargs)
        barrier.wait()
        return runs_read

    monkeypatch.setattr("training.services.steps.fair.waiting_runs", read_then_wait)
    got = []

    def worker(n: int) -> None:
        try:
            got.append(step_turn_claim(run_id=runs[n % 3].id, step=None, me=f"w:{n}"))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    claimed = [run_id for run_id in got if run_id is not None]
    assert len(got) == 5 and sorted(claimed) == sorted(r.id for r in runs)  # each once; two found none
    assert set(Run.objects.filter(id__in=[r.id for r in runs]).values_list("worker", flat=True)) <= {
        f"w:{n}" for n in range(5)
    }


# --- whole runs through run_step_execute ------------------------------------------------------------------------


def deliver(queue: list[tuple], world, limit: int = 60) -> list[tuple[int, int]]:
    """Deliver the step messages in order to one worker until none is left: each message's run_step_execute,
    and the messages it sends join the queue's end. The (run, step) of each step recorded, in order."""
    recorded = []
    for _ in range(limit):
        if not queue:
            return recorded
        (run_id,), kwargs = queue.pop(0)
        before = set(Step.objects.values_list("id", flat=True))
        run_step_execute(run_id=run_id, step=kwargs.get("step"))
        recorded += list(Step.objects.exclude(id__in=before).values_list("run_id", "step"))
        queue += world.next_steps
        world.next_steps.clear()
    raise AssertionError(f"messages still queued after {limit}: {queue}")


@pytest.mark.django_db(transaction=True)
def test_three_runs_of_one_user_do_not_hold_back_another_users_run(alice, bob, world):
    """Alice queues three runs, then bob one: bob's first step is the one after alice's first (the next free
    turn), not the fourth as in arrival order; every step of every run is recorded once and all complete."""
    alices = [make_run(alice, num_steps=2, scenarios_per_step=1) for _ in range(3)]
    bobs = make_run(bob, num_steps=2, scenarios_per_step=1)
    queue = [((run.id,), {}) for run in (*alices, bobs)]  # as run_create sends them, in that order

    recorded = deliver(queue, world)

    assert recorded[:2] == [(alices[0].id, 1), (bobs.id, 1)]
    assert sorted(recorded) == sorted((run.id, step) for run in (*alices, bobs) for step in (1, 2))
    assert set(Run.objects.values_list("status", flat=True)) == {Run.Status.COMPLETED}


@pytest.mark.django_db(transaction=True)
def test_a_user_with_a_large_share_goes_first_and_every_run_still_completes(alice, bob, world):
    """Alice's weight keeps her ahead, so bob's messages are spent on her run; her own messages come back with
    steps she has done, and pass their turns on to bob: bob's run completes too."""
    Quota.objects.create(user=alice, share_weight=1000)
    hers = make_run(alice, num_steps=4, scenarios_per_step=1)
    his = make_run(bob, num_steps=4, scenarios_per_step=1)
    queue = [((hers.id,), {}), ((his.id,), {})]

    recorded = deliver(queue, world)

    # Her message 3 comes back after her step 3 (run with his message): his step 2 takes its turn.
    assert [run_id for run_id, _ in recorded] == [hers.id, his.id, hers.id, hers.id, his.id, hers.id, his.id, his.id]
    assert sorted(recorded) == sorted((run.id, step) for run in (hers, his) for step in (1, 2, 3, 4))
    assert set(Run.objects.values_list("status", flat=True)) == {Run.Status.COMPLETED}
