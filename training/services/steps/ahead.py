"""Rollouts one step ahead: the next step's batch runs while this step trains (RunConfig.overlap_rollouts).

Without it a step rolls out, then trains, and the inference server idles during the update. With it,
once step k's rollouts are in, the worker starts step k+1's batch in a thread against the policy that
sampled step k (the one before step k's update) and then trains step k. Step k+1 takes that batch
instead of rolling out: it trains on data one policy version old. Its metrics say so (`policy_lag` 1),
and `sampler_kl`, the gap between the sampler's log-probs and the trainer's, then measures the policy
change as well as the numerical mismatch; the trainer's ratio clipping (CISPO, PPO) is what keeps such a
batch usable, as in ART's and verl's asynchronous modes.

The batch needs a server that serves the old policy while the new one is loaded beside it: runtime LoRA
adapters ("lora" mode, the default on a GPU). A server that holds one set of weights at a time ("merged"
mode, the CPU default, and the CTranslate2 server) cannot, and steps then run in order; the run's log
says why once.

A batch ahead lives in the worker process that started it. Step k+1 takes it only when it runs in the
same process for the same run, step and policy; a batch that nobody takes (the run paused, cancelled or
failed, the next step picked up elsewhere) is stopped and dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection

from rollouts.sandbox.rollouts import RolloutRequest, run_rollouts

logger = logging.getLogger(__name__)


@dataclass
class Ahead:
    run_id: int
    step: int  # the step whose batch this is
    policy: str  # the model name it rolls out against
    scenarios: list = field(repr=False, default_factory=list)
    results: list | None = None
    error: BaseException | None = None
    seconds: float | None = None  # the batch's own duration, once it ended
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def _run(self, request: RolloutRequest) -> None:
        started = time.perf_counter()
        try:
            self.results = run_rollouts(request, should_stop=self.stop.is_set)
        except BaseException as exc:  # handed to the step that takes the batch
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - started
            connection.close()  # whatever this thread opened

    def wait(self, should_stop: Callable[[], bool]) -> list:
        """The batch's results once it ends; raises what the batch raised. should_stop() stops it (the
        sandbox raises Cancelled)."""
        while self.thread is not None and self.thread.is_alive():
            if should_stop():
                self.stop.set()
            self.thread.join(0.2)
        if self.error is not None:
            raise self.error
        return self.results or []


_lock = threading.Lock()
_ahead: dict[int, Ahead] = {}


def ahead_start(*, run_id: int, step: int, policy: str, scenarios: list, request: RolloutRequest) -> Ahead:
    """Start step `step`'s batch in a thread; any earlier batch ahead for the run is stopped first."""
    ahead_discard(run_id)
    ahead = Ahead(run_id=run_id, step=step, policy=policy, scenarios=scenarios)
    ahead.thread = threading.Thread(
        target=ahead._run, args=(request,), daemon=True, name=f"rollouts-ahead-run-{run_id}"
    )
    with _lock:
        _ahead[run_id] = ahead
    ahead.thread.start()
    logger.info("run %s: step %s's rollouts started ahead against %s", run_id, step, policy)
    return ahead


def ahead_take(*, run_id: int, step: int, served: set[str]) -> Ahead | None:
    """The batch ahead for this run's `step`, if this process has one whose policy the server still
    serves (`served`: the model names it answers to); any other batch ahead for the run is dropped."""
    with _lock:
        ahead = _ahead.pop(run_id, None)
    if ahead is None:
        return None
    if ahead.step != step or ahead.policy not in served:
        why = f"for step {ahead.step}" if ahead.step != step else f"sampled by {ahead.policy}, no longer served"
        logger.info("run %s step %s: dropping the batch ahead (%s)", run_id, step, why)
        _stop(ahead)
        return None
    return ahead


def ahead_policies(run_id: int) -> set[str]:
    """Model names a batch ahead of this run rolls out against: the server must keep serving them."""
    with _lock:
        ahead = _ahead.get(run_id)
    return {ahead.policy} if ahead is not None else set()


def ahead_discard(run_id: int) -> None:
    """Stop and drop the run's batch ahead, if any (its sandbox is killed)."""
    with _lock:
        ahead = _ahead.pop(run_id, None)
    if ahead is not None:
        logger.info("run %s: stopping the batch ahead for step %s", run_id, ahead.step)
        _stop(ahead)


def _stop(ahead: Ahead) -> None:
    ahead.stop.set()
    if ahead.thread is not None:
        ahead.thread.join(timeout=30)
        if ahead.thread.is_alive():
            logger.warning("run %s: the batch ahead for step %s did not stop within 30 s", ahead.run_id, ahead.step)
