"""One GRPO step of a run, as one idempotent unit of work for a GPU worker.

run_step_execute(run_id, step) claims the run (a lease: worker name + heartbeat), then:
sample scenarios → rollouts in the sandbox against the current policy → persist the groups → one
training update → checkpoint → load the new adapter into vLLM → validation every N steps → persist the
step's metrics (the Step row's uniqueness and a conditional update of steps_done make a step count once)
→ broadcast → queue the next step. A redelivered or duplicated task for a step that is already done,
or for a run another live worker holds, does nothing.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import socket
import statistics
import threading
import time
import traceback
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from artweb.dispatch import publish
from artweb.errors import ApplicationError
from artweb.logging import log_context
from rollouts.models import Scenario
from rollouts.runtime import TooManyErrors
from rollouts.runtime.proxy import Upstream
from rollouts.runtime.sandbox import RolloutRequest, SandboxLimits, run_rollouts
from training import signals, task_names
from training.config import RunConfig
from training.exports.hooks import step_committed
from training.exports.weave import export_rollout_env, rollout_egress_hosts
from training.models import BaseModel, Checkpoint, Run, Step, Trajectory, TrajectoryGroup
from training.services import inference
from training.services.alerts import run_alerts_check
from training.services.broadcast import final_answer, group_message, run_broadcast
from training.services.checkpoints import checkpoint_apply_retention
from training.services.judges import judge_endpoint_key, judge_resolve, judge_url_check
from training.services.logs import run_log
from training.services.runs import run_event, run_transition
from training.signals import truncated

logger = logging.getLogger(__name__)
S = Run.Status


class StepFailed(RuntimeError):
    """The step cannot succeed as configured; the message says why and what was kept."""


class StepAborted(Exception):
    """The run was cancelled or paused while the step was in progress."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def stale_after() -> timedelta:
    return timedelta(seconds=settings.ARTWEB["HEARTBEAT_SECONDS"] * 4)


def run_claim(*, run_id: int, me: str) -> bool:
    """Take the run's lease if it is free, ours, or its holder stopped heartbeating, or is a process of
    this host that no longer exists (a pool child killed mid-step: its step message comes back to another
    child at once, long before the dead one's heartbeat goes stale)."""
    now = timezone.now()
    free = Q(worker="") | Q(worker=me) | Q(heartbeat_at__lt=now - stale_after())
    holder = Run.objects.filter(id=run_id).values_list("worker", flat=True).first()
    if holder and _dead_here(holder):
        free |= Q(worker=holder)
    return Run.objects.filter(free, id=run_id, status__in=Run.ACTIVE_STATUSES).update(worker=me, heartbeat_at=now) == 1


def _dead_here(worker: str) -> bool:
    """The worker name is a process of this host that has exited."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def run_release(*, run_id: int, me: str) -> None:
    Run.objects.filter(id=run_id, worker=me).update(worker="")


class Heartbeat:
    """Refreshes the lease from a thread while the step works; exposes cancel/pause flags cheaply."""

    def __init__(self, run_id: int, me: str):
        self.run_id, self.me = run_id, me
        self.interval = settings.ARTWEB["HEARTBEAT_SECONDS"]
        self._stop = threading.Event()
        self.cancel = False
        self.lost = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"heartbeat-run-{run_id}")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def beat(self) -> None:
        from django.db import connection

        try:
            n = Run.objects.filter(id=self.run_id, worker=self.me).update(heartbeat_at=timezone.now())
            self.lost = n == 0
            self.cancel = Run.objects.filter(id=self.run_id, cancel_requested=True).exists()
        finally:
            connection.close()  # this thread's own connection

    def _loop(self):
        while not self._stop.wait(min(self.interval, 2.0)):
            try:
                self.beat()
            except Exception:
                logger.warning("heartbeat failed", exc_info=True)

    def should_stop(self) -> bool:
        return self.cancel or self.lost

    def stop_reason(self) -> str:
        # A lost lease means another worker holds the run now: stop quietly, never cancel it.
        return "cancel" if self.cancel else "lease lost"


def _sample_scenarios(run: Run, cfg: RunConfig, step: int, split: str, count: int) -> list[Scenario]:
    ids = list(
        Scenario.objects.filter(scenario_set=run.scenario_set, split=split)
        .order_by("index")
        .values_list("id", flat=True)
    )
    if not ids or count == 0:
        return []
    # Seeded by (seed, step): a repeated step samples the same scenarios.
    rng = random.Random(f"{cfg.seed}:{split}:{step}")
    chosen = rng.sample(ids, count) if count <= len(ids) else [rng.choice(ids) for _ in range(count)]
    by_id = Scenario.objects.in_bulk(chosen)
    return [by_id[i] for i in chosen]


UNJAILED_EVENT = "sandbox_unjailed"


def sandbox_unjailed_warn(*, run: Run) -> None:
    """Once per run: its user code ran without the jail (ARTWEB_SANDBOX=insecure-no-jail)."""
    if not run.events.filter(kind=UNJAILED_EVENT).exists():
        run_event(
            run=run,
            kind=UNJAILED_EVENT,
            data={"level": "warning"},
            message=(
                "Warning: this worker runs user code WITHOUT the sandbox jail (ARTWEB_SANDBOX=insecure-no-jail). "
                "The rollout script and reward function could read the worker's secrets, reach its database "
                "and change other runs. Use this only on a development machine with code you trust."
            ),
        )


def _wants_judge(run: Run, cfg: RunConfig) -> bool:
    """RULER scores the run, or its code may call art.rewards itself. The text test only decides
    whether the judge is admitted to the batch (in merged mode, a second inference server): code that
    reaches RULER some other way gets an error naming the models it may call."""
    sources = (run.script_version.content, run.reward_version.content if run.reward_version else "")
    return cfg.use_ruler or any("ruler" in source for source in sources)


def _judge_for(run: Run, cfg: RunConfig, server, policy_name: str):
    """(name, Upstream) of the batch's RULER judge, as the run's ruler_judge names it."""
    found = judge_resolve(owner=run.owner, value=cfg.ruler_judge)
    if found is None or (isinstance(found, BaseModel) and found.id == run.base_model_id):
        return inference.judge_endpoint(run.base_model, server=server, policy_name=policy_name)
    if isinstance(found, BaseModel):
        judge = inference.judge_server(found)
        return judge.base_model_name, Upstream(judge.base_url, judge.api_key)
    if found.model == policy_name:
        raise ApplicationError(
            f"The judge endpoint {found.name!r} names the model {found.model!r}, which is also "
            "the policy's name in this batch; rename one of them."
        )
    return found.model, Upstream(judge_url_check(found.base_url), judge_endpoint_key(found))


def failures_allowed(share: float, rollouts: int) -> int:
    """How many of a batch's rollouts may fail under max_exceptions (a share in [0, 1]): 0 none, 0.5 up
    to half, 1.0 all of them (a step with no rollout left to train on fails all the same)."""
    return math.floor(share * rollouts + 1e-9)


def _rollouts(
    run: Run,
    cfg: RunConfig,
    scenarios: list[Scenario],
    model_name: str,
    server,
    hb: Heartbeat,
    group_size: int,
    *,
    timings: dict[str, float] | None = None,
    warm: bool = False,
):
    """The batch's rollouts against `model_name`; timings, when given, gets the judge's share of them:
    "judge_server" (getting a judge server ready) and "ruler" (seconds the judge spent on the groups,
    summed over groups, which are judged while other groups' rollouts still run). warm: a step's training
    batch, which takes the sandbox pre-started for it and pre-starts the next step's."""
    jail = inference.jail_config()
    if not jail.jailed:
        sandbox_unjailed_warn(run=run)
    judge, extra_models = None, {}
    if _wants_judge(run, cfg):
        t = time.perf_counter()
        judge, upstream = _judge_for(run, cfg, server, model_name)
        extra_models[judge] = upstream
        if timings is not None:
            timings["judge_server"] = time.perf_counter() - t
    request = RolloutRequest(
        script=run.script_version.content,
        reward=run.reward_version.content if run.reward_version else None,
        scenarios=[s.data for s in scenarios],
        group_size=group_size,
        base_url=server.base_url,
        model_name=model_name,
        api_key=server.api_key,
        jail=jail,
        vocab_size=inference.vocab_size(run.base_model),
        sampling={"temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_tokens},
        concurrency=cfg.concurrency,
        # The run's setting is a share of the batch; the sandbox takes the count it allows.
        max_exceptions=failures_allowed(cfg.max_exceptions, len(scenarios) * group_size),
        limits=SandboxLimits(rollout_timeout_s=cfg.rollout_timeout_s),
        step=run.steps_done,
        env=(trace_env := export_rollout_env(run=run)),
        egress_hosts=rollout_egress_hosts(trace_env),
        judge_model=judge,
        extra_models=extra_models,
        ruler=cfg.use_ruler,
        warm_key=f"run-{run.id}" if warm else None,
        prestart_next=warm and run.steps_done + 1 < run.num_steps,
    )
    results = run_rollouts(request, should_stop=hb.should_stop)
    if timings is not None and cfg.use_ruler:
        timings["ruler"] = sum(group.judge_s for group in results)
    return results


def _search_text(messages: list[dict]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        for call in m.get("tool_calls") or []:
            fn = (call or {}).get("function") or {}
            parts.append(f"{fn.get('name', '')} {fn.get('arguments', '')}")
    return "\n".join(parts)[:20_000]


def _persist_groups(
    run: Run, step: int, split: str, scenarios: list[Scenario], results, *, me: str, failed: bool = False
) -> list[TrajectoryGroup]:
    """Write the scored groups, and send each to the run page when they commit: rewards now, while the
    update trains; the advantages follow from _store_advantages. `failed`: the groups of an attempt that
    failed, kept to inspect and never trained on."""
    groups = []
    with transaction.atomic():
        # Only while this worker holds the lease, checked under the run's row lock: the heartbeat notices a
        # lost lease only every few seconds, and a batch can finish in less.
        held = (
            Run.objects.select_for_update()
            .filter(id=run.id, worker=me)
            .values_list("cancel_requested", flat=True)
            .first()
        )
        if held is None:
            raise StepAborted("lease lost")
        if held and not failed:  # cancelled while the rollouts ran: the step ends here
            raise StepAborted("cancel")
        # A crashed earlier attempt of this step may have left its groups: replace them. Those of an attempt
        # that failed (and said so) stay, marked.
        TrajectoryGroup.objects.filter(run=run, step=step, split=split, failed_attempt=False).delete()
        for scenario, result in zip(scenarios, results, strict=False):
            trajs = result.trajectories
            rewards = [t["reward"] for t in trajs if t.get("reward") is not None]
            group = TrajectoryGroup.objects.create(
                run=run,
                step=step,
                split=split,
                scenario=scenario,
                reward_mean=statistics.fmean(rewards) if rewards else None,
                reward_std=statistics.pstdev(rewards) if len(rewards) > 1 else (0.0 if rewards else None),
                error_count=sum(1 for t in trajs if t.get("error")),
                skipped=_no_signal(result),
                failed_attempt=failed,
            )
            rows = Trajectory.objects.bulk_create(
                [
                    Trajectory(
                        group=group,
                        run=run,
                        step=step,
                        index=i,
                        messages=t.get("messages") or [],
                        tools=t.get("tools"),
                        reward=t.get("reward"),
                        metrics=t.get("metrics") or {},
                        metadata=t.get("metadata") or {},
                        logs=t.get("logs") or [],
                        error=t.get("error") or "",
                        prompt_tokens=t.get("prompt_tokens") or 0,
                        completion_tokens=t.get("completion_tokens") or 0,
                        duration_ms=t.get("duration_ms") or 0,
                        search_text=_search_text(t.get("messages") or []),
                        reward_ms=t.get("reward_ms"),
                        truncated=truncated(t.get("messages") or []),
                    )
                    for i, t in enumerate(trajs)
                ]
            )
            run_broadcast(run.id, group_message(group, rows))  # leaves on commit; PostgreSQL set the ids
            groups.append(group)
    return groups


def _no_signal(result) -> bool:
    """All the group's rewards are equal (or it has fewer than two): GRPO has nothing to compare."""
    rewards = [t["reward"] for t in result.trajectories if t.get("reward") is not None]
    return len(set(rewards)) <= 1


def _reward_stats(results, cfg: RunConfig | None = None) -> dict:
    """The step's reward and signal figures, from its scored groups (before the update)."""
    trajs = [t for r in results for t in r.trajectories]
    rewards = [t["reward"] for t in trajs if t.get("reward") is not None]
    finished = [t for t in trajs if not t.get("error")]
    completion = [t.get("completion_tokens") or 0 for t in finished]
    stats = {
        "groups": len(results),
        "groups_no_signal": sum(1 for r in results if _no_signal(r)),
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else None,
        "rollouts": len(trajs),
        "rollout_errors": sum(1 for t in trajs if t.get("error")),
        "completion_tokens_mean": statistics.fmean(completion) if completion else 0.0,
        "completion_tokens_total": sum(completion),
    }
    stats["dead_group_share"] = stats["groups_no_signal"] / len(results) if results else None
    stats["truncation_rate"] = (
        sum(1 for t in finished if truncated(t.get("messages") or [])) / len(finished) if finished else None
    )
    stats.update(
        signals.answer_repeat(
            [[final_answer(t.get("messages")) for t in r.trajectories if not t.get("error")] for r in results]
        )
    )
    names = cfg.alerts.reward_components if cfg is not None else []
    stats.update(signals.component_shares(finished, names))
    return stats


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
    me = worker_name()
    if not run_claim(run_id=run_id, me=me):
        logger.info("run %s: not claimable (finished, or held by a live worker)", run_id)
        return
    run = Run.objects.select_related("base_model", "script_version", "reward_version", "scenario_set").get(id=run_id)
    next_step = run.steps_done + 1
    if step is not None and step != next_step:
        run_release(run_id=run_id, me=me)
        logger.info("run %s: step %s already done (at %s); nothing to do", run_id, step, run.steps_done)
        return
    try:
        if _finish_if_requested(run, me):
            return
        if run.status == S.QUEUED:
            run_transition(
                run=run, from_statuses=(S.QUEUED,), to_status=S.STARTING, message=f"Worker {me} picked the run up."
            )
        cfg = RunConfig.model_validate(run.config)
        with Heartbeat(run.id, me) as hb, log_context(run_id=run.id, step=next_step):
            server = inference.inference_server(run.base_model)
            if run.status == S.STARTING:
                run_transition(
                    run=run,
                    from_statuses=(S.STARTING,),
                    to_status=S.RUNNING,
                    message="Inference server ready; training.",
                )
            _execute(run, cfg, next_step, server, hb)
    except StepAborted as exc:
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
        inference.trainer_close()  # it may have trained an update whose step was never recorded
        _requeue_after_database_loss(run_id, next_step, me)
        return
    except Exception as exc:
        logger.exception("run %s step %s failed", run_id, next_step)
        inference.trainer_close()
        # What the attempt persisted stays, marked: a retry writes the step's groups anew beside it.
        TrajectoryGroup.objects.filter(run_id=run_id, step=next_step, failed_attempt=False).update(failed_attempt=True)
        if inference.server_died() and _retry_after_inference_death(run_id, next_step, me, exc):
            return
        run_log(run_id=run_id, step=next_step, level="ERROR", message=traceback.format_exc()[-5000:])
        run.refresh_from_db()
        run_transition(
            run=run,
            from_statuses=Run.ACTIVE_STATUSES,
            to_status=S.FAILED,
            message=f"Step {next_step} failed: {type(exc).__name__}: {exc}"[:1000],
            error=f"{type(exc).__name__}: {exc}"[:5000],
            worker="",
        )
        return
    finally:
        inference.release_memory()
    _after_step(run_id, me)


def _execute(run: Run, cfg: RunConfig, step: int, server, hb: Heartbeat) -> None:
    timings: dict[str, float] = {}
    t_step = time.perf_counter()

    def check():
        if hb.cancel:
            raise StepAborted("cancel")
        if hb.lost:
            raise StepAborted("lease lost")

    # 1. Rollouts against the current policy.
    t = time.perf_counter()
    policy = _policy_model_name(run, server)
    scenarios = _sample_scenarios(run, cfg, step, "train", cfg.scenarios_per_step)
    try:
        results = _rollouts(run, cfg, scenarios, policy, server, hb, cfg.group_size, timings=timings, warm=True)
    except TooManyErrors as exc:
        failed = sum(1 for g in exc.groups for t in g.trajectories if t.get("error"))
        _persist_groups(run, step, "train", scenarios, exc.groups, me=hb.me, failed=True)
        raise StepFailed(
            f"{failed} of {len(scenarios) * cfg.group_size} rollouts failed, more than "
            f"max_exceptions={cfg.max_exceptions:g} allows; the rollouts are kept under step {step} "
            f"in the trajectory inspector. First error:\n{_first_error(exc.groups)[:2000]}"
        ) from exc
    except Exception as exc:
        if type(exc).__name__ == "Cancelled":
            raise StepAborted(hb.stop_reason()) from exc
        raise
    timings["rollouts"] = time.perf_counter() - t
    check()
    stats = _reward_stats(results, cfg)
    if stats["rollouts"] and stats["rollout_errors"] == stats["rollouts"]:
        _persist_groups(run, step, "train", scenarios, results, me=hb.me, failed=True)
        raise StepFailed(
            f"All {stats['rollouts']} rollouts failed, so there is nothing to train on; they are "
            f"kept under step {step} in the trajectory inspector. First error:\n"
            f"{_first_error(results)[:2000]}"
        )

    # 2. Persist the groups (replacing any left by a crashed attempt of this step).
    t = time.perf_counter()
    groups = _persist_groups(run, step, "train", scenarios, results, me=hb.me)
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
    t = time.perf_counter()
    ckpt = _latest_checkpoint(run)
    trainer = inference.trainer_for(run, checkpoint_dir=ckpt.path if ckpt else None)
    timings["trainer_load"] = time.perf_counter() - t
    t = time.perf_counter()
    from training.engine import Cancelled as TrainCancelled

    try:
        train_metrics = trainer.train_step([r.trajectories for r in results], should_stop=hb.should_stop)
    except TrainCancelled as exc:
        inference.trainer_close()  # its state may be mid-accumulation: reload from the checkpoint next time
        raise StepAborted(hb.stop_reason()) from exc
    timings["train"] = time.perf_counter() - t
    advantages = train_metrics.pop("advantages", None) or []
    _store_advantages(groups, advantages)
    stats.update(signals.advantage_stats(advantages))

    # 4. Checkpoint, then the new policy into the inference server.
    t = time.perf_counter()
    ckpt_dir = _checkpoint_dir(run, step)
    try:
        info = trainer.save_checkpoint(str(ckpt_dir))
        inference.trainer_advanced(run.id, step)
        timings["checkpoint"] = time.perf_counter() - t
        t = time.perf_counter()
        new_name = adapter_name(run, step)
        server.ensure_adapter(new_name, str(ckpt_dir))
        server.retire_adapters(keep={new_name})
        inference.adapters_loaded_publish()
        timings["adapter_load"] = time.perf_counter() - t
        check()

        # 5. Validation on held-out scenarios every val_every steps (and at the last step).
        val_reward = None
        if cfg.val_every and cfg.val_scenarios and (step % cfg.val_every == 0 or step == run.num_steps):
            t = time.perf_counter()
            val_reward = _validate(run, cfg, step, new_name, server, hb)
            timings["validation"] = time.perf_counter() - t

        # 6. The step's record: exactly once.
        timings["step"] = time.perf_counter() - t_step
        metrics = {**{k: v for k, v in stats.items() if v is not None}, **_numeric(train_metrics)}
        if val_reward is not None:
            metrics["val_reward"] = val_reward
        _step_commit(run, step, stats, val_reward, metrics, timings, ckpt_dir, info)
    except BaseException:
        # Committed, the directory is the step's checkpoint; otherwise nothing will ever read it.
        if not Checkpoint.objects.filter(run=run, step=step, path=str(ckpt_dir)).exists():
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        raise
    run_alerts_check(run=run, step=step)


DATABASE_WAIT_SECONDS = 120


def _requeue_after_database_loss(run_id: int, step: int, me: str) -> bool:
    """Once the database answers again, give up the lease and queue the step again. If it stays away
    longer than DATABASE_WAIT_SECONDS, the sweep requeues the run once its lease is stale."""
    deadline = time.monotonic() + DATABASE_WAIT_SECONDS
    while time.monotonic() < deadline:
        connections.close_all()  # broken ones: the next query connects anew
        try:
            with transaction.atomic():
                run_release(run_id=run_id, me=me)
                transaction.on_commit(lambda: publish(task_names.RUN_STEP, args=(run_id,), kwargs={"step": step}))
            run_log(
                run_id=run_id,
                step=step,
                level="WARNING",
                message=f"step {step}: the database connection was lost mid-step; the step is tried again",
            )
            return True
        except (OperationalError, InterfaceError):
            time.sleep(2)
    return False


INFERENCE_RETRIES = 2  # attempts at one step after the inference server died under it
INFERENCE_RESTARTED_EVENT = "inference_restarted"


def _retry_after_inference_death(run_id: int, step: int, me: str, exc: Exception) -> bool:
    """The inference server died during the step: queue the step again (the next attempt restarts the
    server with the policy it served) unless this step already had INFERENCE_RETRIES such retries."""
    run = Run.objects.get(id=run_id)
    tried = run.events.filter(kind=INFERENCE_RESTARTED_EVENT, data__step=step).count()
    if tried >= INFERENCE_RETRIES or run.status not in Run.ACTIVE_STATUSES:
        return False
    with transaction.atomic():
        run_event(
            run=run,
            kind=INFERENCE_RESTARTED_EVENT,
            data={"step": step, "retry": tried + 1, "level": "warning"},
            message=(
                f"The inference server stopped during step {step} ({type(exc).__name__}: {str(exc)[:300]}); it is "
                f"restarted and the step tried again (retry {tried + 1} of {INFERENCE_RETRIES}). The failed attempt's "
                "rollouts are kept in the trajectory inspector."
            ),
        )
        run_release(run_id=run_id, me=me)
        transaction.on_commit(lambda: publish(task_names.RUN_STEP, args=(run_id,), kwargs={"step": step}))
    return True


def _first_error(results) -> str:
    return next((t["error"] for r in results for t in r.trajectories if t.get("error")), "")


def _fmt(x):
    return "n/a" if x is None else f"{x:.3f}"


def _numeric(d: dict) -> dict:
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _store_advantages(groups: list[TrajectoryGroup], advantages) -> None:
    """Write the update's advantages, then send each group again, now with them (on commit)."""
    rows = []
    with transaction.atomic():
        for group, advs in zip(groups, advantages, strict=False):
            trajs = list(group.trajectories.all().order_by("index"))
            for traj in trajs:
                if traj.index < len(advs) and advs[traj.index] is not None:
                    traj.advantage = float(advs[traj.index])
                    rows.append(traj)
            run_broadcast(group.run_id, group_message(group, trajs))
        Trajectory.objects.bulk_update(rows, ["advantage"], batch_size=1000)


def _validate(run: Run, cfg: RunConfig, step: int, model_name: str, server, hb: Heartbeat) -> float | None:
    scenarios = _sample_scenarios(run, cfg, 0, "validation", cfg.val_scenarios)  # same held-out set each time
    if not scenarios:
        return None
    # One rollout per scenario is enough for a held-out mean; the runtime needs groups of at least 1.
    results = _rollouts(run, cfg, scenarios, model_name, server, hb, group_size=1)
    _persist_groups(run, step, "validation", scenarios, results, me=hb.me)
    rewards = [t["reward"] for r in results for t in r.trajectories if t.get("reward") is not None]
    return statistics.fmean(rewards) if rewards else None


def _step_commit(run, step, stats, val_reward, metrics, timings, ckpt_dir: Path, info: dict) -> None:
    with transaction.atomic():
        if (
            Run.objects.filter(id=run.id, steps_done=step - 1).update(
                steps_done=step, latest_reward=stats["reward_mean"], heartbeat_at=timezone.now()
            )
            != 1
        ):
            raise StepAborted("step already recorded")
        Step.objects.create(
            run=run,
            step=step,
            reward_mean=stats["reward_mean"],
            reward_std=stats["reward_std"],
            val_reward=val_reward,
            metrics=metrics,
            timings=timings,
            duration_s=timings.get("step", 0.0),
        )
        Checkpoint.objects.update_or_create(
            run=run,
            step=step,
            defaults={
                "path": str(ckpt_dir),
                "size_bytes": int(info.get("size_bytes", 0)),
                "metrics": metrics,
                "val_reward": val_reward,
                "state": Checkpoint.State.ACTIVE,
            },
        )
        if val_reward is not None:
            Run.objects.filter(Q(best_val_reward__isnull=True) | Q(best_val_reward__lt=val_reward), id=run.id).update(
                best_val_reward=val_reward
            )
        run_broadcast(
            run.id,
            {
                "type": "step",
                "run": run.id,
                "step": step,
                "metrics": {**metrics, "duration_s": timings["step"]},
                "timings": timings,
                "steps_done": step,
                "num_steps": run.num_steps,
            },
            to_list=True,
        )

        transaction.on_commit(lambda: step_committed(run_id=run.id, step=step))

    run.refresh_from_db()
    checkpoint_apply_retention(run=run)


def _finish_if_requested(run: Run, me: str, reason: str | None = None) -> bool:
    """Apply a pending cancel or pause, or complete the run when all steps are done. True if it stopped."""
    run.refresh_from_db()
    if run.cancel_requested or reason == "cancel":
        run_transition(
            run=run,
            from_statuses=Run.ACTIVE_STATUSES,
            to_status=S.CANCELLED,
            message=f"Cancelled after {run.steps_done} steps.",
            worker="",
        )
        return True
    if run.pause_requested:
        run_transition(
            run=run,
            from_statuses=Run.ACTIVE_STATUSES,
            to_status=S.PAUSED,
            message=f"Paused after {run.steps_done} steps.",
            worker="",
            pause_requested=False,
        )
        return True
    if run.steps_done >= run.num_steps:
        run_transition(
            run=run,
            from_statuses=Run.ACTIVE_STATUSES,
            to_status=S.COMPLETED,
            message=f"Completed {run.steps_done} steps.",
            worker="",
        )
        inference.trainer_close()
        return True
    if reason:
        run_release(run_id=run.id, me=me)
        return True
    return False


def _after_step(run_id: int, me: str) -> None:
    run = Run.objects.get(id=run_id)
    if _finish_if_requested(run, me):
        return
    next_step = run.steps_done + 1
    with transaction.atomic():
        run_release(run_id=run_id, me=me)
        transaction.on_commit(lambda: publish(task_names.RUN_STEP, args=(run_id,), kwargs={"step": next_step}))


def runs_requeue_stale() -> list[int]:
    """Requeue active runs that nobody is working on.

    Two cases: the run's worker stopped heartbeating (killed, lost its host), or no worker holds the run
    and none has for stale_after() (a worker died between releasing one step and claiming the next, and
    the next step's message waits unacknowledged until the broker's visibility timeout). A duplicate step
    message is harmless: the step task is idempotent.
    """
    now = timezone.now()
    cutoff = now - stale_after()
    requeued = []
    for run in Run.objects.filter(status__in=(S.STARTING, S.RUNNING), heartbeat_at__lt=cutoff):
        with transaction.atomic():
            if (
                Run.objects.filter(id=run.id, worker=run.worker, heartbeat_at__lt=cutoff).update(
                    worker="", heartbeat_at=now
                )
                != 1
            ):
                continue
            if run.worker:
                message = f"Worker {run.worker} stopped heartbeating; requeued from step {run.steps_done}."
            else:
                message = f"No worker took step {run.steps_done + 1}; queued it again."
            run_event(
                run=run, kind="requeued", message=message, data={"worker": run.worker, "steps_done": run.steps_done}
            )
            transaction.on_commit(
                lambda rid=run.id, nxt=run.steps_done + 1: publish(
                    task_names.RUN_STEP, args=(rid,), kwargs={"step": nxt}
                )
            )
        requeued.append(run.id)
    return requeued
