"""Run lifecycle services: conditional transitions, events, enqueue after commit."""

import pytest

from artweb.errors import ApplicationError
from artweb.testing.factories import CheckpointFactory, RunFactory
from training.models import Run, RunEvent
from training.services import run_cancel, run_create, run_pause, run_resume, run_retry, run_transition
from training.services.checkpoints import checkpoint_apply_retention, checkpoint_delete, checkpoint_promote


@pytest.fixture
def enqueued(monkeypatch):
    """Records run_step_task enqueues instead of sending them to a broker (no worker in these tests)."""
    calls = []
    from training import tasks

    monkeypatch.setattr(tasks.run_step_task, "apply_async", lambda args, kwargs: calls.append((args, kwargs)))
    return calls


@pytest.fixture
def sent_at_once(enqueued, monkeypatch):
    """Sends at once rather than after a commit that the test transaction never makes."""
    monkeypatch.setattr("artweb.dispatch.transaction.on_commit", lambda send: send())
    return enqueued


def test_it_creates_a_run_with_defaults_and_enqueues_after_commit(alice, enqueued, django_capture_on_commit_callbacks):
    template = RunFactory(owner=alice)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        run = run_create(
            owner=alice,
            name="r1",
            base_model=template.base_model,
            script_version=template.script_version,
            reward_version=template.reward_version,
            scenario_set=template.scenario_set,
            config={"num_steps": 3},
        )
    assert run.status == Run.Status.QUEUED and run.num_steps == 3
    assert run.config["group_size"] == 6 and run.config["train"]["learning_rate"] > 0
    assert enqueued == [((run.id,), {})]
    assert callbacks  # the enqueue and the broadcast waited for the commit
    assert list(run.events.values_list("kind", flat=True)) == ["created"]


@pytest.mark.parametrize(
    "config, field",
    [
        ({"group_size": 1}, "group_size"),
        ({"num_steps": 0}, "num_steps"),
        ({"bogus": 1}, "bogus"),
        ({"train": {"learning_rate": -1}}, "train"),
    ],
)
def test_it_rejects_bad_config_naming_the_field(alice, enqueued, config, field):
    template = RunFactory(owner=alice)
    before = Run.objects.count()
    with pytest.raises(ApplicationError) as exc:
        run_create(
            owner=alice,
            name="bad",
            base_model=template.base_model,
            script_version=template.script_version,
            scenario_set=template.scenario_set,
            config=config,
        )
    assert field in exc.value.message
    assert any(k.startswith(field) for k in exc.value.field_errors)
    assert Run.objects.count() == before and enqueued == []


def test_it_refuses_other_peoples_assets(alice, bob, enqueued):
    theirs = RunFactory(owner=bob)
    with pytest.raises(ApplicationError):
        run_create(
            owner=alice,
            name="x",
            base_model=theirs.base_model,
            script_version=theirs.script_version,
            scenario_set=theirs.scenario_set,
        )


def test_it_cancels_a_queued_run_at_once_and_flags_a_running_one(alice):
    queued = RunFactory(owner=alice)
    run_cancel(run=queued, actor=alice)
    assert queued.status == Run.Status.CANCELLED and queued.finished_at is not None
    running = RunFactory(owner=alice, status=Run.Status.RUNNING)
    run_cancel(run=running, actor=alice)
    assert running.status == Run.Status.RUNNING and running.cancel_requested
    with pytest.raises(ApplicationError):
        run_cancel(run=queued, actor=alice)


def test_it_pauses_and_resumes(alice, sent_at_once):
    enqueued = sent_at_once
    run = RunFactory(owner=alice)
    run_pause(run=run, actor=alice)
    assert run.status == Run.Status.PAUSED
    run_resume(run=run, actor=alice)
    assert run.status == Run.Status.QUEUED
    assert len(enqueued) == 1
    with pytest.raises(ApplicationError):
        run_resume(run=run, actor=alice)


def test_it_retries_a_failed_run_from_its_last_step(alice, enqueued):
    run = RunFactory(owner=alice, status=Run.Status.FAILED, steps_done=2, error="boom")
    CheckpointFactory(run=run, step=2)
    run_retry(run=run, actor=alice)
    assert run.status == Run.Status.QUEUED and run.error == "" and run.steps_done == 2
    assert "step 2" in run.events.last().message


def test_a_transition_happens_once(alice):
    run = RunFactory(owner=alice)
    assert run_transition(run=run, from_statuses=Run.Status.QUEUED, to_status=Run.Status.STARTING)
    stale = Run.objects.get(id=run.id)
    stale.status = Run.Status.QUEUED  # a second actor that read the old status
    assert not run_transition(run=stale, from_statuses=Run.Status.QUEUED, to_status=Run.Status.STARTING)
    assert RunEvent.objects.filter(run=run, kind="status").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_status_and_its_event_are_committed_together(alice, monkeypatch):
    """Outside any transaction of the caller's (as a worker ends a run): when the event cannot be written,
    the status does not change either, so nobody ever reads a status without its event."""
    from training.jobs import services as job_services

    run = RunFactory(owner=alice, status=Run.Status.RUNNING)

    def failing_event(**kwargs):
        raise RuntimeError("the event table is unavailable")

    monkeypatch.setattr(job_services, "job_event", failing_event)
    with pytest.raises(RuntimeError):
        run_transition(run=Run.objects.get(id=run.id), from_statuses=Run.Status.RUNNING, to_status=Run.Status.CANCELLED)
    assert Run.objects.get(id=run.id).status == Run.Status.RUNNING
    monkeypatch.undo()
    assert run_transition(
        run=Run.objects.get(id=run.id), from_statuses=Run.Status.RUNNING, to_status=Run.Status.CANCELLED
    )
    assert RunEvent.objects.filter(run=run, kind="status", data__to=Run.Status.CANCELLED).count() == 1


def test_retention_keeps_latest_best_and_promoted_and_refuses_the_resume_point(alice, tmp_path):
    run = RunFactory(
        owner=alice, status=Run.Status.RUNNING, config={"keep_last_checkpoints": 1, "keep_best_checkpoints": 1}
    )
    ckpts = {}
    for step, val in [(1, 0.2), (2, 0.9), (3, 0.1), (4, None), (5, None)]:
        d = tmp_path / f"s{step}"
        d.mkdir()
        (d / "adapter_model.safetensors").write_bytes(b"x" * 10)
        ckpts[step] = CheckpointFactory(run=run, step=step, path=str(d), val_reward=val, size_bytes=10)
    checkpoint_promote(checkpoint=ckpts[1], actor=alice)
    with pytest.raises(ApplicationError, match="newest"):
        checkpoint_delete(checkpoint=ckpts[5])
    deleted = checkpoint_apply_retention(run=run, actor=alice)
    assert sorted(c.step for c in deleted) == [3, 4]
    states = dict(run.checkpoints.values_list("step", "state"))
    assert states == {1: "active", 2: "active", 3: "deleted", 4: "deleted", 5: "active"}
    assert run.events.filter(kind="checkpoint_deleted").count() == 2


EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[3] / "rollouts" / "examples"


@pytest.mark.parametrize(
    "script, reward, use_ruler, accepted",
    [
        ("rollout.py", True, False, True),  # the example with its reward function
        ("rollout.py", False, True, True),  # RULER scores it
        ("tool_rollout.py", False, False, True),  # sets trajectory.reward itself
        ("rollout.py", False, False, False),  # nothing would ever give a reward
    ],
)
def test_it_refuses_a_run_without_any_reward_source(alice, enqueued, script, reward, use_ruler, accepted):
    from artweb.testing.factories import RolloutScriptVersionFactory

    template = RunFactory(owner=alice)
    version = RolloutScriptVersionFactory(asset__owner=alice, content=(EXAMPLES / script).read_text())
    kwargs = {
        "owner": alice,
        "name": "r",
        "base_model": template.base_model,
        "script_version": version,
        "reward_version": template.reward_version if reward else None,
        "scenario_set": template.scenario_set,
        "config": {"use_ruler": use_ruler},
    }
    if accepted:
        assert run_create(**kwargs).status == Run.Status.QUEUED
    else:
        with pytest.raises(ApplicationError, match="no reward source") as info:
            run_create(**kwargs)
        assert "reward_version" in info.value.field_errors
        assert not Run.objects.filter(name="r").exists()


def test_it_finds_the_reward_a_bundles_helper_module_sets(alice, enqueued, settings, tmp_path):
    """ART's examples set the reward in their own module, which the bundle's rollout.py calls."""
    from rollouts import services
    from tests.rollouts.bundle_zips import make_zip

    settings.DATA_DIR = tmp_path
    template = RunFactory(owner=alice)
    entry = b"from game import play\n\n\nasync def rollout(model, scenario):\n    return await play(model)\n"
    sets = b"import art\n\n\nasync def play(model):\n    return art.Trajectory(messages_and_choices=[], reward=1.0)\n"
    for name, game, accepted in (("sets", sets, True), ("unset", sets.replace(b", reward=1.0", b""), False)):
        version = services.script_create(
            owner=alice, name=name, bundle=make_zip([("rollout.py", entry), ("game.py", game)])
        )
        kwargs = {
            "owner": alice,
            "name": name,
            "base_model": template.base_model,
            "script_version": version,
            "reward_version": None,
            "scenario_set": template.scenario_set,
        }
        if accepted:
            assert run_create(**kwargs).status == Run.Status.QUEUED
        else:
            with pytest.raises(ApplicationError, match="no reward source"):
                run_create(**kwargs)


def test_it_reads_a_reward_from_the_script_statically():
    from rollouts.sandbox.validation import script_sets_reward

    assert script_sets_reward("async def rollout(m, s):\n    t = make()\n    t.reward = 1.0\n    return t\n")
    assert script_sets_reward(
        "async def rollout(m, s):\n    return art.Trajectory(messages_and_choices=[], reward=0.5)\n"
    )
    assert not script_sets_reward("async def rollout(m, s):\n    return art.Trajectory(messages_and_choices=[])\n")
