"""The fair pick: which waiting run a GPU worker's turn goes to (docs: Scheduling).

A step message (RUN_STEP) is a turn on a GPU worker, not an order to train its own run. The worker that
takes one claims, among the runs waiting for a turn, the first it can in the fair queue's order
(training.selectors_queue.waiting_runs): the runs of the owner with the least GPU time in the last
ARTWEB_FAIR_SHARE_HOURS for their share weight first; at equal time the message's own run, then the run
waiting longest. Each is tried with the run's conditional claim (run_claim): two workers may pick the same
run; the one that loses tries the next. The message's step applies to its own run alone.

Why steps still run exactly once: a run is trained only under its lease, taken by a conditional UPDATE, and
a step is recorded under the conditional update of steps_done and the Step row's (run, step) uniqueness;
which message led to the claim changes none of that.

Why every waiting run gets its turns: a run that starts waiting sends one message (when it is queued, after
each step, when a recovery requeues it), and a message is spent on one waiting run at most. A message spent
on another run leaves its own run waiting while the chosen run's message is still queued, and that one picks
again. So the queued messages are never fewer than the waiting runs, and a message finds no run to claim
only where none waits (a duplicate: it does nothing). That is also why a message whose step its own run has
recorded passes over that run but not the turn: its run was trained with another run's message, and the
turn it carries is that other run's.
"""

from __future__ import annotations

import logging

from training.models import Run
from training.selectors_queue import waiting_runs
from training.services.steps.leases import run_claim, run_release

logger = logging.getLogger(__name__)


def step_turn_claim(*, run_id: int, step: int | None, me: str) -> int | None:
    """Claim, for worker `me`, the run this message's turn goes to: its id, now leased to `me`, or None
    when no waiting run could be claimed. `run_id`, `step`: the message's run and the step it names (None:
    whatever step the run owes)."""
    for waiting in waiting_runs(prefer=run_id):
        own = waiting.run_id == run_id
        if own and step is not None and step != waiting.steps_done + 1:
            continue  # its step is recorded: for this run the message is a duplicate, for the others a turn
        if not run_claim(run_id=waiting.run_id, me=me):
            continue  # another worker claimed it first (or, the message's own run, a live one holds it)
        if own and step is not None and not Run.objects.filter(id=run_id, steps_done=step - 1).exists():
            run_release(run_id=run_id, me=me)  # its step was recorded between the read and the claim
            continue
        if not own:
            logger.info("run %s's turn goes to run %s, first in the fair queue", run_id, waiting.run_id)
        return waiting.run_id
    return None
