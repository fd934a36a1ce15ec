"""One GRPO step of a run, as one idempotent unit of work for a GPU worker.

run_step_execute(run_id, step) claims the run the fair queue puts first (steps.fair; a lease: worker name +
heartbeat), then:
sample scenarios → rollouts in the sandbox against the current policy → persist the groups → one
training update → checkpoint → load the new adapter into vLLM → validation every N steps → persist the
step's metrics (the Step row's uniqueness and a conditional update of steps_done make a step count once)
→ broadcast → queue the next step. A redelivered or duplicated task for a step that is already done,
or for a run another live worker holds, does nothing.
"""

from __future__ import annotations

import logging
import math
import shutil
import statistics
import time
import traceback
import uuid
from pathlib import Path

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction

from artweb.dispatch import publish
from artweb.logging import log_context
from rollouts.sandbox import Cancelled, TooManyErrors
from rollouts.sandbox.records import deadline_stopped
from rollouts.sandbox.rollouts import prestart_batch
from training import task_names
from training.analytics import learning_signals
from training.analytics.alerts import run_alerts_check
from training.config import RunConfig
from training.engine.tokenize import complete_sampled_turns
from training.models import Checkpoint, Run, TrajectoryGroup
from training.services import inference
from training.services.broadcast import queue_broadcast
from training.services.logs import run_log
from training.services.quotas import quota_step_refusal, run_quota_pause
from training.services.runs import run_event, run_transition
from training.services.serving_gate import serving_paused
from training.services.steps.ahead import ahead_discard, ahead_policies, ahead_start, ahead_take
from training.services.steps.batch import rollouts_execute, rollouts_request, rollouts_run, scenarios_sample
from training.services.steps.commit import step_commit
from training.services.steps.errors import StepAborted, StepFailed
from training.services.steps.fair import step_turn_claim
from training.services.steps.groups import advantages_store, groups_persist, reward_stats
from training.services.steps.leases import Heartbeat, run_release, worker_name
from training.services.steps.posted import nothing_posted, posted_failed, posted_take
from training.services.steps.recovery import requeue_after_database_loss, retry_after_inference_death
from training.services.steps.sources import PostedStep, step_source

logger = logging.getLogger(__name__)
OUT_OF_MEMORY_EVENT = "update_out_of_memory"


AHEAD_UNAVAILABLE_EVENT = "overlap_unavailable"


def _checkpoint_dir(run: Run, step: int) -> Path:
    """A directory of this attempt's own: a worker that lost the lease (or an attempt that crashed) never
    writes into the directory of a step another attempt committed; uncommitted ones are removed."""
    return Path(settings.DATA_DIR) / "checkpoints" / f"run-{run.id}" / f"step-{step:06d}-{uuid.uuid4().hex[:8]}"


def _latest_checkpoint(run: Run) -> Checkpoint | None:
    """The checkpoint the run continues from: None at step 0. A run whose last checkpoint is gone fails
    rather than continue from a fresh adapter while its steps say otherwise."""
    if not run.steps_done:
        return None
    ckpt = Checkpoint.objects.filter(run=run, step=run.steps_done, state=Checkpoint.State.ACTIVE).first()
    if ckpt is None or not Path(ckpt.path).is_dir():
        raise StepFailed(
            f"The checkpoint of step {run.steps_done}, which this run continues from, was deleted; "
            'the run cannot go on. Use "Launch similar" to train a new run with the same settings.'
        )
    return ckpt


def adapter_name(run: Run, step: int) -> str:
    return f"run-{run.id}@{step}"


def _policy_model_name(run: Run, server) -> str:
    """The model name rollouts call: the base model at step 0, else the latest checkpoint's adapter."""
    ckpt = _latest_checkpoint(run)
    if ckpt is None:
        return server.ensure_base()
    name = adapter_name(run, ckpt.step)
    server.ensure_adapter(name, ckpt.path)
    return name


def run_step_execute(*, run_id: int, step: int | None = None) -> None:
    """A step message is a turn on this worker: it trains the waiting run the fair queue puts first (steps.fair)."""
    me = worker_name()
    if (chosen := step_turn_claim(run_id=run_id, step=step, me=me)) is None:
        logger.info("run %s step %s: no waiting run to claim (finished, held by live workers, or done)", run_id, step)
        return
    run_id = chosen
    queue_broadcast(left=(run_id,))  # out of the queue: the waiting runs' places move up
    run = Run.objects.select_related("base_model", "script_version", "reward_version", "scenario_set").get(id=run_id)
    next_step = run.steps_done + 1
    try:
        if _finish_if_requested(run, me):
            return
        if nothing_posted(run, me):
            return
        if (reached := quota_step_refusal(user=run.owner)) is not None:
            # Before any of the step's work: the step does not start, and what the run stored stays.
            run_quota_pause(run=run, line=reached, step=next_step)
            ahead_discard(run_id)
            run_release(run_id=run_id, me=me)
            return
        if run.status == Run.Status.QUEUED:
            run_transition(
                run=run,
                from_statuses=(Run.Status.QUEUED,),
                to_status=Run.Status.STARTING,
                message=f"Worker {me} picked the run up.",
            )
        cfg = RunConfig.model_validate(run.config)
        # serving_paused: requests answered between steps wait for the step's end (training.services.serving_gate).
        with Heartbeat(run.id, me) as hb, log_context(run_id=run.id, step=next_step), serving_paused():
            server = inference.inference_server(run.base_model, run=run)
            if run.status == Run.Status.STARTING:
                run_transition(
                    run=run,
                    from_statuses=(Run.Status.STARTING,),
                    to_status=Run.Status.RUNNING,
                    message="Inference server ready; training.",
                )
            _execute(run, cfg, next_step, server, hb)
    except StepAborted as exc:
        ahead_discard(run_id)
        if exc.reason == "cancel":  # (a lost lease: another worker has the step, and the client's job)
            posted_failed(run, "The run was cancelled on artweb; nothing of this job was trained.")
        logger.info("run %s step %s stopped: %s", run_id, next_step, exc.reason)
        # Groups it persisted before stopping were never trained on: kept, marked (only while ours).
        if Run.objects.filter(id=run_id, worker=me).exists():
            TrajectoryGroup.objects.filter(run_id=run_id, step=next_step, failed_attempt=False).update(
                failed_attempt=True
            )
        _finish_if_requested(Run.objects.get(id=run_id), me, reason=exc.reason)
        return
    except (OperationalError, InterfaceError) as exc:
        # The database went away (restarted, unreachable): the step is not at fault. Nothing was committed
        # that a new attempt would repeat (the step's record is one transaction); try it again.
        logger.warning("run %s step %s: lost the database (%s); the step will be tried again", run_id, next_step, exc)
        ahead_discard(run_id)
        inference.trainer_close()  # it may have trained an update whose step was never recorded
        requeue_after_database_loss(run_id, next_step, me)
        return
    except Exception as exc:
        _step_failed(run, next_step, me, exc)
        return
    finally:
        inference.release_memory()
    _after_step(run_id, me)


def _step_failed(run: Run, step: int, me: str, exc: Exception) -> None:
    """A step that raised: retried after an inference server's death; otherwise the run fails, or, for a
    run whose groups a client posts, the client's job fails and the run goes on with its next job (or waits)."""
    logger.exception("run %s step %s failed", run.id, step)
    ahead_discard(run.id)
    inference.trainer_close()
    # What the attempt persisted stays, marked: a retry writes the step's groups anew beside it.
    TrajectoryGroup.objects.filter(run_id=run.id, step=step, failed_attempt=False).update(failed_attempt=True)
    if inference.server_died() and retry_after_inference_death(run.id, step, me, exc):
        return
    run_log(run_id=run.id, step=step, level="ERROR", message=traceback.format_exc()[-5000:])
    run.refresh_from_db()
    reason = f"{type(exc).__name__}: {exc}"
    if posted_failed(run, reason):
        message = f"Step {step} failed and trained nothing; the run is as it was before it: {reason}"
        run_event(run=run, kind="client_job_failed", message=message[:1000], data={"step": step, "level": "error"})
        _after_step(run.id, me)
        return
    run_transition(
        run=run,
        from_statuses=Run.ACTIVE_STATUSES,
        to_status=Run.Status.FAILED,
        message=f"Step {step} failed: {reason}"[:1000],
        error=reason[:5000],
        worker="",
    )


def _execute(run: Run, cfg: RunConfig, step: int, server, hb: Heartbeat) -> None:
    timings: dict[str, float] = {}
    t_step = time.perf_counter()

    # 1. Rollouts against the current policy, or the batch rolled out ahead during the last update; or the
    # groups a client posted (a step source's).
    posted = None
    if (source := step_source(run)) is not None:
        posted, results, scenarios, lag, request, stats = posted_take(run, cfg, step, source, timings)
    else:
        inference.trainer_fit_check(run)  # a model that cannot train here is refused before its rollouts
        results, scenarios, lag, request, stats = _rollouts(run, cfg, step, server, hb, timings)

    # The next step's batch, against the policy that sampled this one, while this step trains.
    if cfg.overlap_rollouts and posted is None and step < run.num_steps:
        _start_ahead(run, cfg, step + 1, server)

    # 2. Persist the groups (replacing any left by a crashed attempt of this step).
    t = time.perf_counter()
    groups = groups_persist(run, step, "train", scenarios, results, me=hb.me)
    timings["persist"] = time.perf_counter() - t
    run_log(
        run_id=run.id,
        step=step,
        message=(
            f"step {step}: {stats['rollouts']} rollouts, reward {_fmt(stats['reward_mean'])}, "
            f"{stats['rollout_errors']} errors, {timings['rollouts']:.1f}s"
        ),
    )

    # 3. One training update on the LoRA.
    trainer, train_metrics = _train(run, step, results, hb, timings, posted)
    if request is not None and request.prestart_next:
        prestart_batch(request)
    advantages = train_metrics.pop("advantages", None) or []
    advantages_store(groups, advantages)
    stats.update(learning_signals.advantage_stats(advantages))

    # 4. Checkpoint, then the new policy into the inference server.
    t = time.perf_counter()
    ckpt_dir = _checkpoint_dir(run, step)
    try:
        info = trainer.save_checkpoint(str(ckpt_dir))
        inference.trainer_advanced(run.id, step, str(ckpt_dir))
        timings["checkpoint"] = time.perf_counter() - t
        new_name = adapter_name(run, step)
        validating = bool(cfg.val_every and cfg.val_scenarios and (step % cfg.val_every == 0 or step == run.num_steps))
        _policy_load(run, new_name, ckpt_dir, server, timings)
        _stop_if_asked(hb)

        # 5. Validation on held-out scenarios every val_every steps (and at the last step).
        val_reward = None
        if validating:
            t = time.perf_counter()
            val_reward = _validate(run, cfg, step, new_name, server, hb)
            timings["validation"] = time.perf_counter() - t

        # 6. The step's record: exactly once.
        timings["step"] = time.perf_counter() - t_step
        metrics = {**{k: v for k, v in stats.items() if v is not None}, **_numeric(train_metrics)}
        if cfg.overlap_rollouts:
            metrics["policy_lag"] = lag
        if val_reward is not None:
            metrics["val_reward"] = val_reward
        in_commit = None
        if posted is not None:
            metrics.update(posted.metrics)
            in_commit = lambda: source.committed(posted, step=step)  # noqa: E731
        step_commit(run, step, stats, val_reward, metrics, timings, ckpt_dir, info, in_commit=in_commit)
    except BaseException:
        # Committed, the directory is the step's checkpoint; otherwise nothing will ever read it.
        if not Checkpoint.objects.filter(run=run, step=step, path=str(ckpt_dir)).exists():
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        raise
    run_alerts_check(run=run, step=step)


def _policy_load(run: Run, name: str, ckpt_dir: Path, server, timings: dict) -> None:
    """The step's new policy into the inference server, beside the policies rolled out ahead, before the step
    is recorded: the step's retention may delete the checkpoint the server held until now (with runs taking
    turns, merged weights thus merge a run's policy at its step's end and again at its next step's start when
    another run's step came between)."""
    t = time.perf_counter()
    server.ensure_adapter(name, str(ckpt_dir))
    server.retire_adapters(keep={name} | ahead_policies(run.id))
    inference.adapters_loaded_publish()
    timings["adapter_load"] = time.perf_counter() - t


def _rollouts(run: Run, cfg: RunConfig, step: int, server, hb: Heartbeat, timings: dict) -> tuple:
    """The step's rollouts (or the batch rolled out ahead) and their reward figures; a step whose rollouts
    failed beyond what the run allows fails here, its groups kept for the inspector."""
    t = time.perf_counter()
    ahead = request = None
    if cfg.overlap_rollouts:
        ahead = ahead_take(run_id=run.id, step=step, served={server.base_model_name, *server.adapters})
    try:
        if ahead is not None:
            policy, scenarios, lag = ahead.policy, ahead.scenarios, 1
            results = ahead.wait(hb.should_stop)
            timings["rollouts_ahead"] = ahead.seconds or 0.0
            if cfg.use_ruler:
                timings["ruler"] = sum(group.judge_s for group in results)
        else:
            policy, lag = _policy_model_name(run, server), 0
            scenarios = scenarios_sample(run, cfg, step, "train", cfg.scenarios_per_step)
            request = rollouts_request(run, cfg, scenarios, policy, server, cfg.group_size, timings=timings, warm=True)
            # The next batch's jail is pre-started after the update, not beside it (see rollouts.sandbox.prestart).
            results = rollouts_execute(request, cfg, hb, timings=timings, prestart=False)
    except TooManyErrors as exc:
        failed = sum(1 for g in exc.groups for t in g.trajectories if t.get("error"))
        groups_persist(run, step, "train", scenarios, exc.groups, me=hb.me, failed=True)
        raise StepFailed(
            f"{failed} of {len(scenarios) * cfg.group_size} rollouts failed, more than "
            f"max_exceptions={cfg.max_exceptions:g} allows; the rollouts are kept under step {step} "
            f"in the trajectory inspector. First error:\n{_first_error(exc.groups)[:2000]}"
        ) from exc
    except Cancelled as exc:  # should_stop() said stop: the sandbox was killed
        raise StepAborted(hb.stop_reason()) from exc
    timings["rollouts"] = time.perf_counter() - t
    _stop_if_asked(hb)
    stats = reward_stats(results, cfg)
    if stats["rollouts"] and stats["rollout_errors"] == stats["rollouts"]:
        groups_persist(run, step, "train", scenarios, results, me=hb.me, failed=True)
        raise StepFailed(
            f"All {stats['rollouts']} rollouts failed, so there is nothing to train on; they are "
            f"kept under step {step} in the trajectory inspector. First error:\n"
            f"{_first_error(results)[:2000]}"
        )
    return results, scenarios, lag, request, stats


def _train(run: Run, step: int, results: list, hb: Heartbeat, timings: dict, posted: PostedStep | None) -> tuple:
    """One update of the LoRA on the step's groups: the trainer (loaded from the latest checkpoint) and
    its metrics. A posted step's settings apply to this update, and its turns that came without the
    sampler's token ids or logprobs get them from the chat template and the current policy."""
    t = time.perf_counter()
    ckpt = _latest_checkpoint(run)
    trainer = inference.trainer_for(run, checkpoint_dir=ckpt.path if ckpt else None)
    timings["trainer_load"] = time.perf_counter() - t
    t = time.perf_counter()
    groups = [r.trajectories for r in results]
    if posted is not None:
        trainer.apply_step_settings(posted.settings)
        complete_sampled_turns(trainer, groups)
        step_source(run).started(posted, num_sequences=sum(len(g) for g in groups))
    try:
        train_metrics = trainer.train_step(groups, should_stop=hb.should_stop)
    except Cancelled as exc:
        inference.trainer_close()  # its state may be mid-accumulation: reload from the checkpoint next time
        raise StepAborted(hb.stop_reason()) from exc
    timings["train"] = time.perf_counter() - t
    if retries := int(train_metrics.get("out_of_memory_retries", 0)):
        _out_of_memory_event(run, step, train_metrics, retries)
    if posted is not None:
        step_source(run).trained(posted, _numeric(train_metrics))
    return trainer, train_metrics


def _stop_if_asked(hb: Heartbeat) -> None:
    """Stop the step where it stands when it was cancelled or its lease was lost."""
    if hb.cancel:
        raise StepAborted("cancel")
    if hb.lost:
        raise StepAborted("lease lost")


def _start_ahead(run: Run, cfg: RunConfig, next_step: int, server) -> None:
    """Start `next_step`'s rollouts in a thread against the current policy, where the server can serve it
    while the next policy is loaded beside it; otherwise say once in the run's log why steps run in order."""
    if server.merged:
        if not run.events.filter(kind=AHEAD_UNAVAILABLE_EVENT).exists():
            message = (
                "overlap_rollouts is on, but this worker's inference server holds one set of weights at a time "
                f"({server.engine}, adapters merged), so it cannot roll out the next step against this policy "
                "while the next one loads: steps run one after the other. Overlapping needs runtime LoRA "
                "adapters (ARTWEB_VLLM_ADAPTER_MODE=lora), a GPU worker's default; on a CPU they generate many "
                "times slower than merged weights, so there it would not pay."
            )
            run_event(run=run, kind=AHEAD_UNAVAILABLE_EVENT, message=message)
            run_log(run_id=run.id, step=next_step - 1, level="WARNING", message=message)
        return
    policy = _policy_model_name(run, server)
    scenarios = scenarios_sample(run, cfg, next_step, "train", cfg.scenarios_per_step)
    request = rollouts_request(run, cfg, scenarios, policy, server, cfg.group_size, warm=True, batch_step=next_step)
    ahead_start(run_id=run.id, step=next_step, policy=policy, scenarios=scenarios, request=request)


def _first_error(results) -> str:
    """The error a failed step quotes: one that names the rollouts its batch's deadline stopped, when the
    deadline was hit, else the first in group order."""
    errors = [t["error"] for r in results for t in r.trajectories if t.get("error")]
    return next((e for e in errors if deadline_stopped(e)), errors[0] if errors else "")


def _fmt(x):
    return "n/a" if x is None else f"{x:.3f}"


def _out_of_memory_event(run: Run, step: int, train_metrics: dict, retries: int) -> None:
    """The update ran out of device memory and fitted with smaller micro-batches: say so, and where to start."""
    before, now = int(train_metrics["micro_batch_tokens_before"]), int(train_metrics["micro_batch_tokens"])
    run_event(
        run=run,
        kind=OUT_OF_MEMORY_EVENT,
        message=(
            f"Step {step}'s update ran out of GPU memory with micro-batches of {before} tokens; it ran again "
            f"with {now} ({retries} {'retry' if retries == 1 else 'retries'}), and later steps start there. "
            f"Set train.micro_batch_tokens to {now} to skip the retry in the next run."
        ),
        data={"step": step, "level": "warning", "micro_batch_tokens": now, "before": before, "retries": retries},
    )


def _numeric(d: dict) -> dict:
    """The trainer's figures that are numbers with a value: a NaN (a mean over no trained token) is left out,
    so the step has no such metric rather than a made-up one (and PostgreSQL's JSON holds no NaN)."""
    return {
        k: float(v)
        for k, v in d.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def _validate(run: Run, cfg: RunConfig, step: int, model_name: str, server, hb: Heartbeat) -> float | None:
    scenarios = scenarios_sample(run, cfg, 0, "validation", cfg.val_scenarios)  # same held-out set each time
    if not scenarios:
        return None
    # One rollout per scenario is enough for a held-out mean; the runtime needs groups of at least 1.
    results = rollouts_run(run, cfg, scenarios, model_name, server, hb, group_size=1)
    groups_persist(run, step, "validation", scenarios, results, me=hb.me)
    rewards = [t["reward"] for r in results for t in r.trajectories if t.get("reward") is not None]
    return statistics.fmean(rewards) if rewards else None


def _finish_if_requested(run: Run, me: str, reason: str | None = None) -> bool:
    """Apply a pending cancel or pause, or complete the run when all steps are done. True if it stopped
    (and then no batch rolled out ahead for it is kept)."""
    stopped = _finish(run, me, reason)
    if stopped:
        ahead_discard(run.id)
    return stopped


def _finish(run: Run, me: str, reason: str | None) -> bool:
    run.refresh_from_db()
    if run.cancel_requested or reason == "cancel":
        run_transition(
            run=run,
            from_statuses=Run.ACTIVE_STATUSES,
            to_status=Run.Status.CANCELLED,
            message=f"Cancelled after {run.steps_done} steps.",
            worker="",
        )
        return True
    if run.pause_requested:
        run_transition(
            run=run,
            from_statuses=Run.ACTIVE_STATUSES,
            to_status=Run.Status.PAUSED,
            message=f"Paused after {run.steps_done} steps.",
            worker="",
            pause_requested=False,
        )
        return True
    if run.steps_done >= run.num_steps and step_source(run) is None:  # a client's run ends when it says so
        run_transition(
            run=run,
            from_statuses=Run.ACTIVE_STATUSES,
            to_status=Run.Status.COMPLETED,
            message=f"Completed {run.steps_done} steps.",
            worker="",
        )
        inference.trainer_run_finished(run.id)  # the other runs' kept states stay
        return True
    if reason:
        run_release(run_id=run.id, me=me)
        return True
    return False


def _after_step(run_id: int, me: str) -> None:
    run = Run.objects.get(id=run_id)
    if _finish_if_requested(run, me):
        return
    if nothing_posted(run, me):
        return
    next_step = run.steps_done + 1
    with transaction.atomic():
        run_release(run_id=run_id, me=me)
        transaction.on_commit(lambda: publish(task_names.RUN_STEP, args=(run_id,), kwargs={"step": next_step}))
        queue_broadcast()  # back in the queue, at its place
