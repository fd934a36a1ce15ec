"""The step's rollouts: scenarios sampled for the step, the RULER judge admitted to the batch, and the
batch run in the sandbox against the current policy."""

from __future__ import annotations

import dataclasses
import math
import random
import time

from django.conf import settings

from artweb.errors import ApplicationError
from rollouts.models import Scenario
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.proxy import Upstream
from rollouts.sandbox.rollouts import RolloutRequest, run_rollouts
from rollouts.selectors import attachments_resolve, bundle_limits, script_version_bundle, script_version_sources
from training.config import RunConfig
from training.exports.weave import export_rollout_env, rollout_egress_hosts
from training.models import PretrainedModel, Run
from training.services import inference
from training.services.judges import judge_resolve, judge_upstream
from training.services.runs import run_event
from training.services.steps.leases import Heartbeat
from training.services.tools import egress_recorder, run_secrets_env, run_tool_hosts


def scenarios_sample(run: Run, cfg: RunConfig, step: int, split: str, count: int) -> list[Scenario]:
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
    # A bundle's helper modules count: art.rewards may be called from any of them.
    sources = [*script_version_sources(run.script_version), run.reward_version.content if run.reward_version else ""]
    return cfg.use_ruler or any("ruler" in source for source in sources)


def _judge_for(run: Run, cfg: RunConfig, server, policy_name: str):
    """(name, Upstream) of the batch's RULER judge, as the run's ruler_judge names it."""
    found = judge_resolve(owner=run.owner, value=cfg.ruler_judge)
    if found is None or (isinstance(found, PretrainedModel) and found.id == run.base_model_id):
        return inference.judge_endpoint(run.base_model, server=server, policy_name=policy_name)
    if isinstance(found, PretrainedModel):
        judge = inference.judge_server(found)
        return judge.base_model_name, Upstream(judge.base_url, judge.api_key)
    if found.model == policy_name:
        raise ApplicationError(
            f"The judge endpoint {found.name!r} names the model {found.model!r}, which is also "
            "the policy's name in this batch; rename one of them."
        )
    return found.model, judge_upstream(found)


def failures_allowed(share: float, rollouts: int) -> int:
    """How many of a batch's rollouts may fail under max_exceptions (a share in [0, 1]): 0 none, 0.5 up
    to half, 1.0 all of them (a step with no rollout left to train on fails all the same)."""
    return math.floor(share * rollouts + 1e-9)


def rollouts_run(
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
    request = rollouts_request(run, cfg, scenarios, model_name, server, group_size, timings=timings, warm=warm)
    return rollouts_execute(request, cfg, hb, timings=timings)


def rollouts_execute(
    request: RolloutRequest,
    cfg: RunConfig,
    hb: Heartbeat,
    *,
    timings: dict[str, float] | None = None,
    prestart: bool = True,
):
    """rollouts_run's batch from its request; prestart=False leaves the next batch's pre-start to the
    caller (rollouts.sandbox.rollouts.prestart_batch), at a moment of its choosing."""
    if not prestart:
        request = dataclasses.replace(request, prestart_next=False)
    results = run_rollouts(request, should_stop=hb.should_stop)
    if timings is not None and cfg.use_ruler:
        timings["ruler"] = sum(group.judge_s for group in results)
    return results


def rollouts_request(
    run: Run,
    cfg: RunConfig,
    scenarios: list[Scenario],
    model_name: str,
    server,
    group_size: int,
    *,
    timings: dict[str, float] | None = None,
    warm: bool = False,
    batch_step: int | None = None,
) -> RolloutRequest:
    """The sandbox's request for a batch against `model_name` (rollouts_run's arguments; the database
    work, judge server included, is done here, so that the batch itself can run on another thread).
    batch_step: the training step the batch is for (default: the run's next), which decides whether a
    warm batch pre-starts a sandbox for one more."""
    batch_step = run.steps_done + 1 if batch_step is None else batch_step
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
    return RolloutRequest(
        script=run.script_version.content,
        reward=run.reward_version.content if run.reward_version else None,
        scenarios=[s.data for s in scenarios],
        scenario_numbers=[s.index for s in scenarios],  # the inspector's numbers, in errors that name rollouts
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
        # The run's Weave hosts and its named hosts (training.services.tools): the tunnel opens to these only.
        egress_hosts=tuple(dict.fromkeys(rollout_egress_hosts(trace_env) + run_tool_hosts(run=run, cfg=cfg))),
        secrets=run_secrets_env(run=run, cfg=cfg),
        on_egress=egress_recorder(run=run, step=batch_step),
        egress_policy=settings.ARTWEB_EGRESS,
        judge_model=judge,
        extra_models=extra_models,
        ruler=cfg.use_ruler,
        warm_key=f"run-{run.id}" if warm else None,
        prestart_next=warm and batch_step < run.num_steps,
        bundle=script_version_bundle(run.script_version),
        bundle_limits=bundle_limits(),
        attachments=attachments_resolve(owner=run.owner, names=cfg.attachments),
    )
