"""Whole-system runs with the real parts: PostgreSQL, Redis, a Celery worker process that starts a vLLM
CPU server with the default model, the sandboxed example task, the PEFT trainer, and a WebSocket client
connected to the ASGI server. The fault tests start their workers as `make run` does (prefork pool) and
never call the sweep: the workers' own sweepers recover. Where what is tested does not depend on the
inference server, the workers start the CTranslate2 one (`inference_engine`), which starts in seconds
where vLLM's CPU build takes half a minute or more; the vLLM server's own failure has its test here."""

import signal
import time
from pathlib import Path

import pytest

from artweb.testing import stack
from artweb.testing.private_redis import PrivateRedis
from training.models import Checkpoint, Run, RunEvent, Step
from training.services import run_create

pytestmark = pytest.mark.e2e

SMALL = {
    "num_steps": 3,
    "group_size": 4,
    "scenarios_per_step": 2,
    "max_tokens": 24,
    "val_every": 3,
    "val_scenarios": 2,
    "keep_last_checkpoints": 3,
    "train": {"learning_rate": 5e-5},
}


@pytest.mark.vllm
def test_it_runs_three_steps_end_to_end(example_run_inputs, stack_env, procs, socket_for, tmp_path):
    web = stack.start_web(stack_env, tmp_path / "logs")
    procs.append(web)
    run = run_create(name="e2e", config=SMALL, **example_run_inputs)
    sock = socket_for(web.extra["url"], run.id, example_run_inputs["owner"])
    procs.append(stack.start_gpu_worker(stack_env, tmp_path / "logs"))

    stack.wait_for(
        lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES,
        timeout=900,
        interval=2,
        procs=procs,
        what="the run to finish",
    )
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, (run.error, procs[-1].tail())
    assert list(Step.objects.filter(run=run).values_list("step", flat=True)) == [1, 2, 3]
    step3 = Step.objects.get(run=run, step=3)
    assert step3.val_reward is not None and step3.metrics["tokens_trained"] > 0
    assert {"rollouts", "train", "checkpoint", "adapter_load"} <= set(step3.timings)
    # The learning-signal monitor's figures, stored with each step (and sent live: below).
    monitor = ("dead_group_share", "effective_batch", "advantage_std", "truncation_rate", "sampler_kl", "entropy")
    assert all(name in step3.metrics for name in monitor), step3.metrics
    assert 0 <= step3.metrics["effective_batch"] <= step3.metrics["rollouts"]
    scored = run.trajectories.filter(group__split="train", error="")
    assert scored.exists() and not scored.filter(reward_ms__isnull=True).exists()  # the example reward was timed
    for ckpt in Checkpoint.objects.filter(run=run):
        assert (Path(ckpt.path) / "adapter_model.safetensors").exists()
        assert ckpt.size_bytes > 0
    assert run.groups.filter(split="train").count() == 3 * SMALL["scenarios_per_step"]
    assert run.trajectories.filter(group__split="train").count() == 3 * 2 * 4
    traj = run.trajectories.filter(group__split="train", error="").first()
    assistant = [m for m in traj.messages if m["role"] == "assistant"]
    assert assistant and len(assistant[0]["token_ids"]) == len(assistant[0]["logprobs"]) > 0
    kinds = list(RunEvent.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds[0] == "created" and kinds.count("status") >= 3

    stack.wait_for(lambda: len(sock.of_type("step")) == 3, timeout=10, what="three step messages on the socket")
    assert [m["step"] for m in sock.of_type("step")] == [1, 2, 3]
    assert all(name in sock.of_type("step")[-1]["metrics"] for name in monitor)
    assert sock.of_type("status")[-1]["status"] == "completed"


@pytest.mark.inference_engine("ctranslate2")
def test_a_run_trains_on_the_ctranslate2_server(example_run_inputs, stack_env, procs, tmp_path):
    """The CPU inference path for processors without bf16 units (ARTWEB_INFERENCE_ENGINE, as the probe
    picks it there): the worker starts artweb's CTranslate2 server, each step's policy is served merged,
    and the trainer gets token ids and log-probs from it, validation included."""
    env = stack_env
    procs.append(stack.start_gpu_worker(env, tmp_path / "logs", pool="prefork"))
    run = run_create(name="e2e-ct2", config={**SMALL, "num_steps": 2, "val_every": 2}, **example_run_inputs)
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES,
        timeout=900,
        interval=2,
        procs=procs,
        what="the run to finish",
    )
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, (run.error, procs[-1].tail())
    assert list(Step.objects.filter(run=run).values_list("step", flat=True)) == [1, 2]
    step2 = Step.objects.get(run=run, step=2)
    assert step2.val_reward is not None and step2.metrics["tokens_trained"] > 0
    assert step2.metrics["sampler_kl"] < 0.05  # the server's log-probs are the trained policy's own
    logs = Path(env["ARTWEB_DATA_DIR"]) / "logs"
    assert list(logs.glob("ctranslate2-*.log")) and not list(logs.glob("vllm-*.log"))
    for traj in run.trajectories.filter(group__split="train", error=""):
        for message in (m for m in traj.messages if m["role"] == "assistant"):
            assert len(message["token_ids"]) == len(message["logprobs"]) > 0


@pytest.mark.vllm
def test_overlapped_rollouts_run_one_policy_behind_on_vllms_runtime_adapters(
    example_run_inputs, stack_env, procs, tmp_path
):
    """overlap_rollouts on a real worker and vLLM serving runtime LoRA adapters (the GPU default; here the CPU
    build told ARTWEB_VLLM_ADAPTER_MODE=lora): each step after the first trains on the batch rolled out during
    the update before it, one policy version behind, and says so in its metrics."""
    env = {**stack_env, "ARTWEB_VLLM_ADAPTER_MODE": "lora"}
    procs.append(stack.start_gpu_worker(env, tmp_path / "logs", pool="prefork"))
    config = {**SMALL, "num_steps": 3, "val_every": 3, "overlap_rollouts": True}
    run = run_create(name="e2e-overlap", config=config, **example_run_inputs)
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES,
        timeout=900,
        interval=2,
        procs=procs,
        what="the run to finish",
    )
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, (run.error, procs[-1].tail())
    steps = list(Step.objects.filter(run=run).order_by("step"))
    assert [s.metrics["policy_lag"] for s in steps] == [0, 1, 1]
    assert all("rollouts_ahead" in s.timings for s in steps[1:]) and "rollouts_ahead" not in steps[0].timings
    assert steps[2].val_reward is not None and all(s.metrics["tokens_trained"] > 0 for s in steps)
    assert not run.events.filter(kind="overlap_unavailable").exists()
    for traj in run.trajectories.filter(group__split="train", group__step=3, error=""):
        for message in (m for m in traj.messages if m["role"] == "assistant"):
            assert len(message["token_ids"]) == len(message["logprobs"]) > 0


@pytest.mark.inference_engine("ctranslate2")  # the recovery does not depend on the server; it starts in seconds
def test_a_killed_worker_is_replaced_and_no_step_runs_twice(example_run_inputs, stack_env, procs, tmp_path):
    run = run_create(name="fault", config={**SMALL, "val_every": 0}, **example_run_inputs)
    first = stack.start_gpu_worker(stack_env, tmp_path / "logs", name="worker-a", pool="prefork")
    procs.append(first)
    # Kill it in the middle of step 2: after step 1 is recorded and the worker has claimed step 2.
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).steps_done >= 1, timeout=600, interval=1, procs=procs, what="step 1"
    )
    stack.wait_for(
        lambda: Run.objects.filter(id=run.id, steps_done=1).exclude(worker="").exists(),
        timeout=60,
        interval=0.1,
        what="step 2 started",
    )
    time.sleep(1.0)
    first.kill(signal.SIGKILL)
    first.extra["must_live"] = False
    assert Run.objects.get(id=run.id).status == Run.Status.RUNNING

    second = stack.start_gpu_worker(
        {**stack_env, "ARTWEB_VLLM_PORT": str(stack.free_port())}, tmp_path / "logs", name="worker-b", pool="prefork"
    )
    procs.append(second)
    # Nobody calls the sweep: the second worker's own sweeper requeues the run once the lease is stale.
    killed_at = time.monotonic()
    stack.wait_for(
        lambda: RunEvent.objects.filter(run=run, kind="requeued").exists(),
        timeout=120,
        interval=0.5,
        procs=[second],
        what="the stale run to be requeued by the worker's sweeper",
    )
    stale_s = 4 * int(stack_env["ARTWEB_HEARTBEAT_SECONDS"])
    print(f"requeued {time.monotonic() - killed_at:.1f} s after the kill (stale period {stale_s} s)")
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES,
        timeout=900,
        interval=2,
        procs=[second],
        what="the run to finish on the second worker",
    )
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, (run.error, second.tail())
    assert list(Step.objects.filter(run=run).values_list("step", flat=True)) == [1, 2, 3]
    assert run.groups.filter(split="train").count() == 3 * SMALL["scenarios_per_step"]
    assert RunEvent.objects.filter(run=run, kind="requeued").count() == 1


@pytest.mark.inference_engine("ctranslate2")  # the recovery does not depend on the server; it starts in seconds
def test_pause_resume_lease_loss_and_cancel_with_a_live_worker(example_run_inputs, stack_env, procs, tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    from training.services import run_cancel, run_pause, run_resume
    from training.services.steps import runs_requeue_stale

    run = run_create(name="lifecycle", config={**SMALL, "num_steps": 8, "val_every": 0}, **example_run_inputs)
    procs.append(stack.start_gpu_worker(stack_env, tmp_path / "logs"))
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).steps_done >= 1, timeout=600, interval=0.5, procs=procs, what="step 1"
    )

    # Pause: the step in progress finishes and is recorded; no further step starts.
    run_pause(run=Run.objects.get(id=run.id))
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).status == Run.Status.PAUSED,
        timeout=300,
        interval=0.5,
        procs=procs,
        what="the run to pause",
    )
    paused_at = Run.objects.get(id=run.id).steps_done
    assert list(Step.objects.filter(run=run).values_list("step", flat=True)) == list(range(1, paused_at + 1))
    assert not run.groups.filter(step__gt=paused_at).exists()

    # Resume: the same worker continues from the checkpoint of the last recorded step.
    run_resume(run=Run.objects.get(id=run.id))
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).steps_done == paused_at + 1,
        timeout=300,
        interval=0.2,
        procs=procs,
        what="a step after resuming",
    )
    resumed_step = Step.objects.get(run=run, step=paused_at + 1)
    assert resumed_step.metrics["tokens_trained"] > 0

    # Another worker takes the lease mid-step (as after a network partition): this worker notices at its
    # next heartbeat, drops the step and leaves the run alone: still running, the other worker's.
    done = Run.objects.get(id=run.id).steps_done
    worker = procs[-1]
    stack.wait_for(lambda: _running(worker, "bwrap"), timeout=60, interval=0.05, what="the next step's rollouts")
    Run.objects.filter(id=run.id).update(worker="elsewhere:1", heartbeat_at=timezone.now())
    worker_log = procs[-1].log
    stack.wait_for(
        lambda: f"step {done + 1} stopped: lease lost" in worker_log.read_text(),
        timeout=60,
        interval=0.2,
        procs=procs,
        what="the worker to notice the lost lease",
    )
    run.refresh_from_db()
    assert (run.status, run.worker, run.steps_done) == (Run.Status.RUNNING, "elsewhere:1", done)
    assert not run.groups.filter(step__gt=done).exists()
    assert not run.events.filter(kind="status", message__startswith="Cancelled").exists()
    # The other worker dies in turn; the stale-lease sweep hands the run back and it goes on.
    Run.objects.filter(id=run.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert runs_requeue_stale() == [run.id]
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).steps_done == done + 1,
        timeout=300,
        interval=0.2,
        procs=procs,
        what="the step after the lease came back",
    )

    # Cancel while the next step's rollouts are in flight: it stops within that rollout batch, and the
    # interrupted step leaves no row, no groups, no checkpoint.
    done = Run.objects.get(id=run.id).steps_done
    stack.wait_for(lambda: _running(worker, "bwrap"), timeout=60, interval=0.05, what="the next step's rollouts")
    requested = time.monotonic()
    run_cancel(run=Run.objects.get(id=run.id))
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).status == Run.Status.CANCELLED,
        timeout=120,
        interval=0.2,
        procs=procs,
        what="the run to cancel",
    )
    latency = time.monotonic() - requested
    run.refresh_from_db()
    assert run.steps_done == done and Step.objects.filter(run=run).count() == done
    assert not run.groups.filter(step__gt=done).exists()
    assert not Checkpoint.objects.filter(run=run, step__gt=done).exists()
    # A whole step takes ~25 s here; stopping inside the rollout batch takes a heartbeat poll (≤ 2 s) and
    # the sandbox's exit.
    assert latency < 15, f"cancel took {latency:.1f}s"
    assert run.events.filter(kind="status", message__startswith=f"Cancelled after {done} steps").exists()
    assert procs[-1].popen.poll() is None  # the worker lives on for the next run


def _descendants(proc: stack.Proc):
    import psutil

    return psutil.Process(proc.popen.pid).children(recursive=True)


def _running(proc: stack.Proc, name: str) -> bool:
    """A process called `name` runs under the worker at normal priority: for "bwrap", a batch's rollouts
    (the jail pre-started for a run's next batch waits at a low priority until its batch begins)."""
    import psutil

    for p in _descendants(proc):
        try:
            if p.name() == name and p.nice() == 0:
                return True
        except psutil.NoSuchProcess:  # a sandbox that just ended
            continue
    return False


@pytest.mark.inference_engine("ctranslate2")  # the recovery does not depend on the server; it starts in seconds
def test_a_pool_child_killed_mid_step_is_replaced_at_once(example_run_inputs, stack_env, procs, tmp_path):
    """The GPU worker as the launcher starts it (prefork): its pool child is SIGKILLed in the middle of step 2.
    The parent starts a new child, the step's message comes back to it, and it takes the dead child's
    lease at once; every step is recorded exactly once."""
    import psutil

    run = run_create(name="prefork", config={**SMALL, "val_every": 0}, **example_run_inputs)
    # A new pool child imports the trainer's libraries before it takes a task (training.services.warmup): over
    # 10 s on a loaded two-core machine, more than the 8 s stale period of the other tests' 2 s heartbeat. A
    # 5 s heartbeat (20 s stale; 60 s by default) keeps this test about the takeover, not about the machine.
    env = {**stack_env, "ARTWEB_HEARTBEAT_SECONDS": "5"}
    worker = stack.start_gpu_worker(env, tmp_path / "logs", name="prefork", pool="prefork")
    procs.append(worker)
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).steps_done >= 1, timeout=600, interval=1, procs=procs, what="step 1"
    )
    stack.wait_for(
        lambda: Run.objects.filter(id=run.id, steps_done=1).exclude(worker="").exists(),
        timeout=60,
        interval=0.1,
        what="step 2 started",
    )
    holder = Run.objects.get(id=run.id).worker
    child = psutil.Process(int(holder.rsplit(":", 1)[1]))
    assert child.ppid() == worker.popen.pid  # the pool child, not the worker's main process
    child.kill()
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES,
        timeout=900,
        interval=2,
        procs=[worker],
        what="the run to finish on a new pool child",
    )
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, (run.error, worker.tail())
    assert list(Step.objects.filter(run=run).values_list("step", flat=True)) == [1, 2, 3]
    assert run.groups.filter(split="train", failed_attempt=False).count() == 3 * SMALL["scenarios_per_step"]
    assert not RunEvent.objects.filter(run=run, kind="requeued").exists()  # taken over, not swept


@pytest.mark.vllm
def test_a_vllm_server_killed_mid_rollouts_is_restarted_and_the_step_retried(
    example_run_inputs, stack_env, procs, tmp_path
):
    run = run_create(name="vllm-dies", config={**SMALL, "val_every": 0, "max_tokens": 48}, **example_run_inputs)
    worker = stack.start_gpu_worker(stack_env, tmp_path / "logs", name="vllm-dies", pool="prefork")
    procs.append(worker)
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).steps_done >= 1, timeout=600, interval=1, procs=procs, what="step 1"
    )
    # Mid-rollouts: step 2's sandbox (bubblewrap) is up, its rollouts calling the server.
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).steps_done == 1 and _running(worker, "bwrap"),
        timeout=120,
        interval=0.05,
        what="step 2's rollouts",
    )
    vllm = [p for p in _descendants(worker) if "--served-model-name" in p.cmdline()]
    pids = {p.pid for p in vllm}
    servers = [p for p in vllm if p.ppid() not in pids]  # the API server, not its engine process
    assert len(servers) == 1, [p.cmdline() for p in _descendants(worker)]
    left_behind = servers[0].children(recursive=True)  # its engine and worker processes
    servers[0].kill()
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES,
        timeout=900,
        interval=2,
        procs=[worker],
        what="the run to finish after the restart",
    )
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, (run.error, worker.tail())
    assert list(Step.objects.filter(run=run).values_list("step", flat=True)) == [1, 2, 3]
    restarted = RunEvent.objects.filter(run=run, kind="inference_restarted")
    assert restarted.count() == 1 and restarted.get().data["step"] == 2
    assert run.groups.filter(split="train", step=2, failed_attempt=True).exists()
    assert run.groups.filter(split="train", step=2, failed_attempt=False).count() == SMALL["scenarios_per_step"]
    # The killed server's own processes were ended with it, not left holding their memory.
    assert left_behind and not [p for p in left_behind if p.is_running() and p.status() != "zombie"]


@pytest.mark.inference_engine("ctranslate2")  # the recovery does not depend on the server; it starts in seconds
def test_redis_restarted_mid_run_loses_nothing(example_run_inputs, stack_env, procs, tmp_path):
    """The worker's broker and channel layer is a Redis that is killed in the middle of step 2 and started
    again empty 3 s later. The run is dispatched by the worker's own sweep (it is created without a
    message: the test's process talks to another Redis)."""
    private = PrivateRedis(tmp_path)
    private.start()
    try:
        run = run_create(name="redis-restart", config={**SMALL, "val_every": 0}, start=False, **example_run_inputs)
        Run.objects.filter(id=run.id).update(dispatched_at=None)  # owed: the worker's sweeper sends it
        env = {**stack_env, "REDIS_URL": private.url, "CELERY_BROKER_URL": private.url, "ARTWEB_SWEEP_SECONDS": "2"}
        worker = stack.start_gpu_worker(env, tmp_path / "logs", name="redis-restart", pool="prefork")
        procs.append(worker)
        stack.wait_for(
            lambda: Run.objects.get(id=run.id).steps_done == 1 and _running(worker, "bwrap"),
            timeout=600,
            interval=0.05,
            procs=procs,
            what="step 2's rollouts",
        )
        private.kill()
        time.sleep(3)
        private.start()
        stack.wait_for(
            lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES,
            timeout=600,
            interval=2,
            procs=[worker],
            what="the run to finish after Redis came back",
        )
        run.refresh_from_db()
        assert run.status == Run.Status.COMPLETED, (run.error, worker.tail())
        assert list(Step.objects.filter(run=run).values_list("step", flat=True)) == [1, 2, 3]
        assert run.groups.filter(split="train", failed_attempt=False).count() == 3 * SMALL["scenarios_per_step"]
    finally:
        private.kill()


@pytest.mark.inference_engine("ctranslate2")  # the recovery does not depend on the server; it starts in seconds
def test_postgresql_unavailable_mid_run_loses_nothing(example_run_inputs, stack_env, procs, tmp_path):
    """What a PostgreSQL restart looks like to the worker, on the shared server the tests use: every
    connection to the run's database is dropped in the middle of step 2 and new ones are refused for 5 s."""
    import psycopg
    from django.db import connection

    run = run_create(name="pg-restart", config={**SMALL, "val_every": 0}, **example_run_inputs)
    worker = stack.start_gpu_worker(stack_env, tmp_path / "logs", name="pg-restart", pool="prefork")
    procs.append(worker)
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).steps_done == 1 and _running(worker, "bwrap"),
        timeout=600,
        interval=0.05,
        procs=procs,
        what="step 2's rollouts",
    )
    db = connection.settings_dict
    name = db["NAME"]
    connection.close()  # this test's own connection goes too, as in a restart
    with psycopg.connect(
        host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], dbname="postgres", autocommit=True
    ) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
                time.sleep(0.2)
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES,
        timeout=600,
        interval=2,
        procs=[worker],
        what="the run to finish after the database came back",
    )
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, (run.error, worker.tail())
    assert list(Step.objects.filter(run=run).values_list("step", flat=True)) == [1, 2, 3]
    assert run.groups.filter(split="train", failed_attempt=False).count() == 3 * SMALL["scenarios_per_step"]
