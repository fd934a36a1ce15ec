"""Dry runs: a rollout script tried on a few scenarios against the base model, before any run.

dry_run_create validates and queues one; a GPU worker's dry_run_execute runs it on that worker's
inference server and stores the trajectories with the reward's spread within each scenario. A dry run
is a background job of the kind DRY_RUN_JOBS (training.jobs): claimed, heartbeating, finished or failed,
and failed by the sweep when its worker stops heartbeating (a dry run is short: start it again).
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from artweb.errors import ApplicationError
from artweb.visibility import require_visible
from rollouts.models import RewardFunctionVersion, RolloutScriptVersion, ScenarioSet
from rollouts.sandbox.records import deadline_stopped, deadline_summary, reward_failed
from rollouts.sandbox.rollouts import dry_run
from rollouts.selectors import attachments_lookup, attachments_resolve, bundle_limits, script_version_bundle
from training import task_names
from training.config import run_config_parse
from training.engine.advantages import group_advantages
from training.jobs.kinds import FAIL, JobKind
from training.jobs.leases import JobHeartbeat, worker_name
from training.jobs.services import job_claim, job_enqueue, job_event, job_fail, job_finish
from training.models import DryRun, Run
from training.services import inference

logger = logging.getLogger(__name__)

MAX_DRY_RUN_SCENARIOS = 8
DEFAULT_DRY_RUN_SCENARIOS = 4  # taken from a scenario set when no count is given
MAX_DRY_RUN_SAMPLES = 16  # rollouts per scenario
MAX_DRY_RUN_ROLLOUTS = 64  # scenarios x samples: a dry run must finish within its task's time limit
DRY_RUN_WAVE = 16  # rollouts the sandbox runs at once; each wave gets the single-wave time budget
DRY_RUN_WAVE_S = 90.0

DRY_RUN_JOBS = JobKind(name="dry_runs", model=DryRun, task=task_names.DRY_RUN, recovery=FAIL)


def _bounded_int(value, *, name: str, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        message = f"{name} must be a whole number from {low} to {high} ({what}); got {value!r}."
        raise ApplicationError(message, field_errors={name: [message]})
    return value


@transaction.atomic
def dry_run_create(
    *,
    owner,
    script_version: RolloutScriptVersion,
    base_model,
    reward_version: RewardFunctionVersion | None = None,
    scenario_set: ScenarioSet | None = None,
    scenarios: list[dict] | None = None,
    scenario_count: int | None = None,
    samples: int = 1,
    attachments: list[str] | None = None,
) -> DryRun:
    """Queue a dry run of a script on a few scenarios: those given, or the first scenario_count of a set.

    With samples > 1 each scenario is rolled out that many times as one group, and the result says
    whether the reward spreads within each group: GRPO learns only from groups whose rewards differ.
    attachments: names of the owner's data attachments, bound at /data/<name> as a run's are.
    """
    # A dry run may use what its owner may see, as a run may.
    require_visible(owner, script_version, what="script", field="script_version", owner_field="asset__owner")
    require_visible(owner, base_model, what="base model", field="base_model")
    if reward_version is not None:
        require_visible(
            owner, reward_version, what="reward function", field="reward_version", owner_field="asset__owner"
        )
    if scenario_set is not None:
        require_visible(owner, scenario_set, what="scenario set", field="scenario_set")
    samples = _bounded_int(samples, name="samples", low=1, high=MAX_DRY_RUN_SAMPLES, what="rollouts per scenario")
    attachments = _attachments_check(owner, attachments or [])
    if scenarios is None:
        if scenario_set is None:
            raise ApplicationError(
                "Pick a scenario set or give scenarios to try the script on.",
                field_errors={"scenario_set": ["required"]},
            )
        count = _bounded_int(
            DEFAULT_DRY_RUN_SCENARIOS if scenario_count is None else scenario_count,
            name="scenario_count",
            low=1,
            high=MAX_DRY_RUN_SCENARIOS,
            what="scenarios to try",
        )
        scenarios = list(scenario_set.scenarios.order_by("index").values_list("data", flat=True)[:count])
    if not scenarios or not all(isinstance(s, dict) for s in scenarios):
        raise ApplicationError(
            "Scenarios must be a non-empty list of JSON objects.",
            field_errors={"scenarios": ["list of objects required"]},
        )
    if len(scenarios) > MAX_DRY_RUN_SCENARIOS:
        message = f"A dry run tries at most {MAX_DRY_RUN_SCENARIOS} scenarios; {len(scenarios)} were given. Give fewer."
        raise ApplicationError(message, field_errors={"scenarios": [message]})
    if len(scenarios) * samples > MAX_DRY_RUN_ROLLOUTS:
        message = (
            f"{len(scenarios)} scenarios x {samples} samples is {len(scenarios) * samples} rollouts; a dry "
            f"run does at most {MAX_DRY_RUN_ROLLOUTS}. Try fewer scenarios or fewer samples."
        )
        raise ApplicationError(message, field_errors={"samples": [message]})
    dry_run = DryRun.objects.create(
        owner=owner,
        script_version=script_version,
        reward_version=reward_version,
        base_model=base_model,
        scenarios=scenarios,
        samples=samples,
        attachments=attachments,
    )
    job_event(jobs=DRY_RUN_JOBS, job=dry_run, kind="created", message="Dry run queued.", actor=owner)
    dry_run_enqueue(dry_run)
    return dry_run


def _attachments_check(owner, names) -> list[str]:
    """The attachment names checked as a run's are: the run config's rules for the list (names, count, each
    once), then each one the owner's own (rollouts.selectors.attachments_resolve), else an error naming it."""
    try:
        names = run_config_parse({"attachments": names}).attachments
    except ApplicationError as exc:
        problems = [
            m for field, messages in exc.field_errors.items() if field.startswith("attachments") for m in messages
        ]
        message = f"attachments: {problems[0] if problems else exc.message}"
        raise ApplicationError(message, field_errors={"attachments": problems or [message]}) from exc
    attachments_resolve(owner=owner, names=names)
    return names


def _attachments_bound(obj: DryRun) -> dict[str, Path]:
    """name -> stored file of each attachment the dry run names, looked up again as it runs: one deleted
    since it was queued fails the dry run, naming the attachment."""
    files, missing = attachments_lookup(owner=obj.owner, names=obj.attachments)
    if missing:
        raise ApplicationError(
            f"The data attachment {missing[0]!r} that this dry run names was deleted after it was queued, so it "
            f"cannot be at /data/{missing[0]}. Upload it again under the same name, then start the dry run again."
        )
    return files


def dry_run_timeout_s(*, rollouts: int) -> float:
    """The wall-clock budget of a dry run's sandbox batch: one wave's budget per DRY_RUN_WAVE rollouts."""
    return DRY_RUN_WAVE_S * max(1, math.ceil(rollouts / DRY_RUN_WAVE))


def dry_run_spread(trajectories: list[dict], *, scenario_count: int) -> dict:
    """Whether the reward spreads within each scenario's rollouts: the signal GRPO trains on.

    `trajectories`: the sandbox's records, each with its "scenario_index" and "reward" (None: failed).
    A scenario has signal by the trainer's own rule (training.engine.advantages): at least two scored
    rollouts whose rewards are not all equal. Returns {"scenarios": [{"index", "rewards", "scored",
    "errors", "std", "min", "max", "signal"}], "with_spread", "scenario_count", "samples", "failed",
    "reward_failed", "level", "message"}: level is how the page shows the message ("error", "warning",
    "success", or "" for neither); failed counts the rollouts with an error, reward_failed those whose
    error is the reward function's (it raised, gave no finite number, or timed out).
    """
    rows = []
    for index in range(scenario_count):
        group = [t for t in trajectories if t.get("scenario_index") == index]
        rewards = [t.get("reward") for t in group]
        scored = [r for r in rewards if r is not None]
        rows.append(
            {
                "index": index,
                "rewards": rewards,
                "scored": len(scored),
                "errors": sum(1 for t in group if t.get("error")),
                "std": statistics.pstdev(scored) if scored else None,
                "min": min(scored) if scored else None,
                "max": max(scored) if scored else None,
                "signal": group_advantages(rewards, scale_rewards=False) is not None,
            }
        )
    mine = [t for t in trajectories if t.get("scenario_index") in range(scenario_count)]
    failures = Failures(
        rollouts=len(mine),
        failed=sum(1 for t in mine if t.get("error")),
        reward_failed=sum(1 for t in mine if reward_failed(t.get("error"))),
    )
    samples = max((len(r["rewards"]) for r in rows), default=0)
    with_spread = sum(r["signal"] for r in rows)
    if not any(r["scored"] for r in rows):
        level = "error"  # nothing scored (every rollout or reward failed, or gave None): fix before launching
    elif samples < 2:
        level = ""  # one answer per scenario says nothing about spread either way
    else:
        level = "success" if with_spread == scenario_count else "warning"
    return {
        "scenarios": rows,
        "with_spread": with_spread,
        "scenario_count": scenario_count,
        "samples": samples,
        "failed": failures.failed,
        "reward_failed": failures.reward_failed,
        "level": level,
        "message": _deadline_note(mine) + _spread_message(rows, with_spread, samples, failures),
    }


def _deadline_note(trajectories: list[dict]) -> str:
    """First, when the batch reached its time limit: which rollouts it stopped (the sandbox's own summary)."""
    stopped = next((t["error"] for t in trajectories if deadline_stopped(t.get("error"))), None)
    if stopped is None:
        return ""
    return deadline_summary(stopped) + " Each one's error below says where it was and what it printed last. "


@dataclass(frozen=True)
class Failures:
    rollouts: int  # rollouts in all
    failed: int  # with an error
    reward_failed: int  # whose error is the reward function's


def _spread_message(rows: list[dict], with_spread: int, samples: int, f: Failures) -> str:
    n = len(rows)
    if f.rollouts and f.reward_failed == f.rollouts:
        return (
            f"The reward function failed on all {f.rollouts} answers, so no reward could be compared and GRPO "
            "would have nothing to learn from. Each answer's error is below: fix the reward function (a "
            "reward must be a finite number) and dry run again before launching."
        )
    if f.rollouts and f.failed == f.rollouts:
        where = f" ({f.reward_failed} in the reward function, the others in the script)" if f.reward_failed else ""
        return (
            f"No rollout was scored: all {f.rollouts} failed{where}; each one's error is below. Fix that and "
            "dry run again before launching: GRPO would have nothing to learn from."
        )
    if not any(r["scored"] for r in rows):
        return (
            "No answer got a reward: the reward gave None (not scored) for every one. Make it return a number "
            "for each answer, then dry run again."
        )
    note = _failure_note(f)
    if samples < 2:
        return (
            "One rollout per scenario shows no spread: dry run with 2 or more samples to see whether "
            "this reward tells answers apart." + note
        )
    if with_spread == n:
        return f"This reward gives spread on all {n} scenarios: every group has something to learn from." + note
    if with_spread:
        return (
            f"This reward gives spread on {with_spread} of {n} scenarios; the others got equal rewards "
            "for every answer and teach nothing." + note
        )
    if f.failed:
        # Failures, not the reward's scale, may be what left each scenario without two rewards to compare.
        return (
            f"No scenario got two different rewards, and {f.failed} of {f.rollouts} rollouts failed"
            f"{_reward_share(f)}: fix those errors first (each one's is below), then dry run again."
        )
    return (
        "No scenario got different rewards: GRPO would have nothing to learn from. Make the reward "
        "finer-grained (partial credit), use harder or more varied scenarios, or sample at a higher "
        "temperature."
    )


def _reward_share(f: Failures) -> str:
    if not f.reward_failed:
        return ""
    if f.reward_failed == f.failed:
        return ", all in the reward function"
    return f", {f.reward_failed} of them in the reward function"


def _failure_note(f: Failures) -> str:
    if not f.failed:
        return ""
    return f" {f.failed} of {f.rollouts} rollouts failed{_reward_share(f)}: see each one's error below."


def dry_run_enqueue(dry_run: DryRun) -> None:
    """Send the dry run's message after commit; when the broker cannot take it, the sweep sends it later."""
    job_enqueue(jobs=DRY_RUN_JOBS, job=dry_run)


def dry_run_execute(*, dry_run_id: int) -> None:
    """Run a dry run against the base model on this worker's inference server."""
    me = worker_name()
    if not job_claim(jobs=DRY_RUN_JOBS, job_id=dry_run_id, me=me):
        return
    obj = DryRun.objects.select_related("script_version", "reward_version", "base_model").get(id=dry_run_id)
    try:
        with JobHeartbeat(DRY_RUN_JOBS, obj.id, me):
            result = _dry_run_result(obj)
        job_finish(jobs=DRY_RUN_JOBS, job=obj, result=result)
    except Exception as exc:
        logger.exception("dry run %s failed", dry_run_id)
        job_fail(jobs=DRY_RUN_JOBS, job=obj, error=f"{type(exc).__name__}: {exc}")


def _dry_run_result(obj: DryRun) -> dict:
    attachments = _attachments_bound(obj)  # before the server starts: a missing file fails at once
    name = obj.base_model.name
    _stage(
        obj,
        f"Starting the inference server for {name}, or finding it running (the first start takes a minute or more).",
    )
    server = inference.inference_server(obj.base_model)
    n = len(obj.scenarios)
    _stage(obj, f"Rolling out {n} scenario{'s' * (n != 1)} x {obj.samples} against {name} in the sandbox.")
    # Each scenario is one group of `samples` rollouts, as a training step would roll it out.
    result = dry_run(
        script=obj.script_version.content,
        reward=obj.reward_version.content if obj.reward_version else None,
        scenarios=obj.scenarios,
        max_scenarios=len(obj.scenarios),
        group_size=obj.samples,
        timeout_s=dry_run_timeout_s(rollouts=len(obj.scenarios) * obj.samples),
        base_url=server.base_url,
        model_name=server.ensure_base(),
        api_key=server.api_key,
        jail=inference.jail_config(),
        vocab_size=inference.vocab_size(obj.base_model),
        bundle=script_version_bundle(obj.script_version),
        bundle_limits=bundle_limits(),
        attachments=attachments,
    )
    result["spread"] = dry_run_spread(result["trajectories"], scenario_count=len(obj.scenarios))
    return result


def _stage(obj: DryRun, message: str) -> None:
    """What a running dry run is doing now, for its page (dry_run_waiting)."""
    job_event(jobs=DRY_RUN_JOBS, job=obj, kind="stage", message=message)


def dry_run_waiting(dry_run: DryRun) -> str:
    """What an unfinished dry run waits for, in words for its page: a worker (none running, or busy), or
    the stage its worker is at and for how long."""
    if dry_run.status == "running":
        stage = dry_run.events.filter(kind="stage").order_by("-id").first()
        if stage is None:
            return "A worker took it and is starting."
        seconds = max(0, int((timezone.now() - stage.created_at).total_seconds()))
        return f"{stage.message} ({seconds} s so far)"
    gpu_workers = workers_alive_count("gpu")
    if gpu_workers == 0:
        return (
            "No GPU worker is running, so nothing can take it yet: start one (make run starts one; "
            "Operations > Workers in the docs says how)."
        )
    if Run.objects.filter(status__in=Run.ACTIVE_STATUSES).exclude(worker="").exists():
        return "Queued: the worker is busy with a training step and takes it next."
    return "Queued: a worker takes it in a moment."


def workers_alive_count(queue: str) -> int | None:
    """Workers of the queue marked alive (training.sweeper); None when Redis cannot say."""
    import redis

    from training.sweeper import workers_alive

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        try:
            return workers_alive(client).get(queue, 0)
        finally:
            client.close()
    except redis.RedisError:
        return None
