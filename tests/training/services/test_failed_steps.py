"""A step that fails keeps what it produced, max_exceptions is a share of the step's rollouts, and a retry
never silently changes where the run starts from.

The step runs in this process through run_step_execute, as the worker runs it, with the real jailed
sandbox and the database. No inference server is started (minutes on two CPU cores): the scripts never
call the model, so the server is an address that is never dialled, and training is replaced by a marker
that says the step got past its rollouts (no step here is meant to train).
"""

from types import SimpleNamespace
from unittest import mock

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from artweb.errors import ApplicationError
from artweb.testing.factories import CheckpointFactory, RolloutScriptVersionFactory, RunFactory
from training.config import run_config_parse
from training.models import Checkpoint, Run, TrajectoryGroup
from training.services import inference, run_retry, steps

pytestmark = pytest.mark.django_db(transaction=True)  # the heartbeat thread reads the run on its own connection

# Every other rollout fails (the sandbox runs the groups in one process here, so the counter is shared).
HALF_FAIL = """
import art, itertools

counter = itertools.count()

async def rollout(model, scenario):
    n = next(counter)
    print(f"rollout {n} starting")
    if n % 2:
        raise RuntimeError(f"rollout {n} broke")
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"},
                                                {"role": "assistant", "content": f"answer {n}"}], reward=n / 10)
"""
ALL_FAIL = """
import art

async def rollout(model, scenario):
    print("about to fail")
    raise ValueError("no luck")
"""


class ReachedTraining(Exception):
    pass


@pytest.fixture(autouse=True)
def worker(monkeypatch, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    server = SimpleNamespace(
        base_url="http://127.0.0.1:9/v1",
        api_key="k",
        merged=True,
        base_model_name="SmolLM2-135M-Instruct",
        ensure_base=lambda: "SmolLM2-135M-Instruct",
    )
    monkeypatch.setattr(inference, "inference_server", lambda base_model, run=None: server)
    monkeypatch.setattr(inference, "vocab_size", lambda base_model: None)

    def trainer_for(run, checkpoint_dir):
        raise ReachedTraining(f"training from {checkpoint_dir}")

    monkeypatch.setattr(inference, "trainer_for", trainer_for)


def make_run(owner, script: str, max_exceptions: float) -> Run:
    config = run_config_parse(
        {"max_exceptions": max_exceptions, "group_size": 2, "scenarios_per_step": 2, "concurrency": 1}
    ).model_dump()
    return RunFactory(
        owner=owner,
        status=Run.Status.QUEUED,
        config=config,
        reward_version=None,
        script_version=RolloutScriptVersionFactory(asset__owner=owner, content=script),
    )


def execute(run) -> Run:
    steps.run_step_execute(run_id=run.id)
    run.refresh_from_db()
    return run


def test_at_zero_one_failure_fails_the_step_and_its_rollouts_are_kept_with_their_logs(alice):
    run = execute(make_run(alice, HALF_FAIL, 0.0))
    assert run.status == Run.Status.FAILED and run.steps_done == 0
    assert "more than max_exceptions=0 allows" in run.error and "rollout 1 broke" in run.error
    groups = list(TrajectoryGroup.objects.filter(run=run, step=1))
    assert groups and all(g.failed_attempt for g in groups)
    trajs = [t for g in groups for t in g.trajectories.order_by("index")]
    failed = [t for t in trajs if "rollout 1 broke" in t.error]
    assert failed and any("rollout 1 starting" in str(line) for line in failed[0].logs)

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=alice).key}")
    listed = api.get(f"/api/v1/runs/{run.id}/trajectories/?step=1").json()["results"]
    assert listed and all(t["failed_attempt"] for t in listed)
    assert any("rollout 1 broke" in t["error"] for t in listed)


def test_a_share_lets_that_many_fail_and_the_step_goes_on(alice):
    run = execute(make_run(alice, HALF_FAIL, 0.5))  # 2 of 4 fail: exactly half
    assert "ReachedTraining" in run.error  # past the rollouts, into the update
    assert not TrajectoryGroup.objects.filter(run=run, failed_attempt=False).exists()  # the failed step's groups
    assert TrajectoryGroup.objects.filter(run=run, step=1).count() == 2


def test_at_one_any_number_may_fail_but_a_step_with_nothing_left_fails(alice):
    run = execute(make_run(alice, ALL_FAIL, 1.0))
    assert run.status == Run.Status.FAILED
    assert run.error.startswith("StepFailed: All 4 rollouts failed, so there is nothing to train on")
    assert "no luck" in run.error
    assert TrajectoryGroup.objects.filter(run=run, step=1, failed_attempt=True).count() == 2


def test_the_failed_attempts_of_a_step_are_all_kept(alice):
    run = execute(make_run(alice, ALL_FAIL, 1.0))
    run_retry(run=run)
    run = execute(run)
    assert run.status == Run.Status.FAILED
    groups = TrajectoryGroup.objects.filter(run=run, step=1)
    assert groups.count() == 4 and all(g.failed_attempt for g in groups)


def test_failures_allowed_reads_the_setting_as_a_share():
    assert [steps.failures_allowed(s, 24) for s in (0.0, 0.1, 0.5, 1.0)] == [0, 2, 12, 24]


def test_a_retry_says_which_checkpoint_it_continues_from_and_refuses_when_it_is_gone(alice, tmp_path):
    run = RunFactory(owner=alice, status=Run.Status.FAILED, steps_done=3)
    path = tmp_path / "ck"
    path.mkdir()
    ckpt = CheckpointFactory(run=run, step=3, path=str(path))
    run_retry(run=run)
    assert run.events.last().message == "Retrying: continuing from the checkpoint of step 3."

    Run.objects.filter(id=run.id).update(status=Run.Status.FAILED)
    run.refresh_from_db()
    Checkpoint.objects.filter(id=ckpt.id).update(state=Checkpoint.State.DELETED)
    with pytest.raises(ApplicationError, match="the checkpoint of step 3, its last completed step, was deleted"):
        run_retry(run=run)
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED


def test_a_worker_never_continues_from_a_fresh_adapter_when_the_checkpoint_is_gone(alice):
    run = make_run(alice, HALF_FAIL, 0.5)
    Run.objects.filter(id=run.id).update(steps_done=2, status=Run.Status.RUNNING)
    CheckpointFactory(run=run, step=2, path="/nonexistent/ck", state=Checkpoint.State.DELETED)
    run = execute(run)
    assert run.status == Run.Status.FAILED and "checkpoint of step 2" in run.error and "was deleted" in run.error


@pytest.mark.slow
def test_a_step_whose_inference_server_died_is_retried_a_bounded_number_of_times(alice, monkeypatch):
    # The server's death is what this test cannot cause without a vLLM server (minutes to start here):
    # the check that reads the server's process is replaced; the retry around it is real.
    monkeypatch.setattr(inference, "server_died", lambda: True)
    sent = []
    monkeypatch.setattr(steps.recovery, "publish", lambda task, args, kwargs: sent.append((args, kwargs)))
    run = make_run(alice, ALL_FAIL, 1.0)
    for attempt in range(1, steps.INFERENCE_RETRIES + 1):
        with mock.patch("django.db.transaction.on_commit", side_effect=lambda fn: fn()):
            run = execute(run)
        assert run.status == Run.Status.RUNNING and run.worker == "" and sent[-1] == ((run.id,), {"step": 1})
        event = run.events.filter(kind=steps.INFERENCE_RESTARTED_EVENT).last()
        assert f"retry {attempt} of {steps.INFERENCE_RETRIES}" in event.message
    run = execute(run)  # one death too many: the run fails, saying why
    assert run.status == Run.Status.FAILED and "All 4 rollouts failed" in run.error
    assert len(sent) == steps.INFERENCE_RETRIES
    assert TrajectoryGroup.objects.filter(run=run, step=1, failed_attempt=True).count() == 2 * 3
