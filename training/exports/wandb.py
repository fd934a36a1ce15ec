"""Weights & Biases: the run's config, every step's metrics (dashboard names), validation results, a
table of sample trajectories per step, and optionally each checkpoint as a model artifact.

Each attempt resumes the same W&B run (its id is kept in ExportProgress.remote_id), logs the steps
after the cursor and finishes. Online, a resumed run ignores steps it already has, so an attempt that
failed half-way can simply be repeated.

The network is wandb's own: its service process (wandb-core) opens the connections, so it cannot be handed
a connection of ours. Every online attempt runs with a LocalEgressProxy (rollouts.sandbox.tunnel) as that
run's http_proxy and https_proxy: wandb-core sends all of a run's requests through it, to any host (the
server, the storage its answers point uploads to, a host a redirect names), and the proxy connects only
where the egress guard allows. The server is also checked before wandb starts, for a clear refusal.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings as django_settings

from rollouts.sandbox.egress import EgressRefused, egress_url_check
from rollouts.sandbox.tunnel import LocalEgressProxy
from training.exports.base import ExportError, ExportJob
from training.models import Checkpoint, Run, Step, Trajectory

MESSAGE_TEXT_LIMIT = 4000  # characters of a rendered conversation in a table cell
INIT_TIMEOUT_S = 30.0  # a W&B server that does not answer by then counts as down; the attempt is retried
TEST_INIT_TIMEOUT_S = 15.0  # a person waits on the page for a test event's answer


def _offline(cfg) -> bool:
    # WANDB_MODE=offline in the worker's environment is the operator's say over the whole installation
    # (no route to W&B from here, say). It decides that files stay on disk, never whose key or which
    # server is used, so it holds for every target.
    return cfg.mode == "offline" or os.environ.get("WANDB_MODE") in ("offline", "dryrun")


def wandb_settings(cfg, secret: str, *, worker_env: bool, init_timeout: float) -> dict:
    """Keyword arguments of wandb.Settings for one attempt; ExportError when there is no key to use.

    A user's target (worker_env False) names its key and its server explicitly, because wandb would
    otherwise fill them in itself from the worker's WANDB_API_KEY, WANDB_BASE_URL or netrc login: the
    operator's own. Settings given to wandb.init win over those.
    """
    import wandb

    offline = _offline(cfg)
    out = {
        "silent": True,
        "console": "off",
        "x_disable_stats": True,
        "x_disable_machine_info": True,
        "disable_git": True,
        "save_code": False,
        "x_save_requirements": False,
        "init_timeout": init_timeout,
    }
    if cfg.mode == "offline":
        out["mode"] = "offline"
    if not offline and not secret:
        if worker_env:
            raise ExportError(
                "W&B needs an API key: enter one in the export settings, "
                "or set WANDB_API_KEY in the worker's environment."
            )
        raise ExportError(
            "W&B needs an API key: enter yours in the export's settings "
            "(the Exports page, or `artweb exports edit ID --secret`)."
        )
    if secret:
        out["api_key"] = secret
    if cfg.base_url:
        out["base_url"] = cfg.base_url
    elif not worker_env:
        out["base_url"] = wandb.Settings.model_fields["base_url"].default  # W&B's own cloud
    return out


def _staging(offline: bool) -> tuple[Path, Path | None]:
    """(wandb's dir, the scratch dir to remove after). Offline files stay (for `wandb sync`); online,
    the local copy is only a staging area."""
    if offline:
        root = Path(os.environ.get("WANDB_DIR") or Path(django_settings.DATA_DIR) / "exports" / "wandb")
        root.mkdir(parents=True, exist_ok=True)
        return root, None
    scratch = Path(tempfile.mkdtemp(prefix="artweb-wandb-"))
    return scratch, scratch


@contextmanager
def _egress(cfg, wb_settings: dict, *, worker_env: bool) -> Iterator[LocalEgressProxy | None]:
    """An online attempt's egress: the server checked now, and wb_settings' proxies set to a LocalEgressProxy
    for as long as the attempt lasts. None offline, where wandb connects to nothing."""
    if _offline(cfg):
        yield None
        return
    import wandb

    server = (
        wb_settings.get("base_url")
        or (os.environ.get("WANDB_BASE_URL") if worker_env else None)
        or wandb.Settings.model_fields["base_url"].default
    )
    try:
        egress_url_check(server, django_settings.ARTWEB_EGRESS)
    except EgressRefused as exc:
        raise ExportError(f"W&B at {server} cannot be used: {exc}") from None
    with LocalEgressProxy(django_settings.ARTWEB_EGRESS) as proxy:
        wb_settings["http_proxy"] = wb_settings["https_proxy"] = proxy.url
        yield proxy


# What follows "HTTP 502:" (or "returned error 502:") in wandb's errors is the answer's body, which may be
# anything the server sent: the status stays, the rest goes. (An answer in W&B's own error shape, JSON
# with an "errors" list, becomes wandb's message itself and stays: "user is not logged in".)
_BODY_AFTER_STATUS = re.compile(r"((?:HTTP|returned error) \d{3})\b.*", re.DOTALL)


def _init(wandb, what: str, proxy: LocalEgressProxy | None, **kwargs):
    try:
        return wandb.init(reinit="create_new", **kwargs)
    except Exception as exc:  # wandb raises several types for auth and network failures
        # The failed run stays registered with this process's wandb service ("run ID is in use" on
        # the next attempt) until the service is shut down.
        wandb.teardown()
        raise ExportError(f"W&B refused the {what}: {_error_text(exc, proxy)}") from exc


def _error_text(exc: Exception, proxy: LocalEgressProxy | None) -> str:
    """wandb's error without any body an answer carried (its status stays), and what went wrong on the way
    out (a refusal of the guard, a server that could not be reached), which wandb would report only as
    the proxy's status."""
    text = _BODY_AFTER_STATUS.sub(r"\1", f"{type(exc).__name__}: {exc}")[:500]
    if proxy is not None and proxy.problems:
        text += f" On the way out: {proxy.problems[0]}"
    return text


def _import_wandb():
    # The W&B client reports its own crashes to a third party unless told not to; an operator may opt in.
    os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    # wandb.init also starts Weave when weave is imported in the process, and Weave asks for a login on
    # the terminal when it finds no key of its own: a worker would wait on that prompt. An export never
    # traces anything itself (Weave runs inside the rollout sandbox), so that is switched off.
    os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
    import wandb

    return wandb


def wandb_export(job: ExportJob) -> None:
    wandb = _import_wandb()

    cfg = job.settings
    progress = job.progress
    wb_settings = wandb_settings(cfg, job.secret, worker_env=job.worker_env, init_timeout=INIT_TIMEOUT_S)
    if not progress.remote_id:
        progress.remote_id = f"artweb-{job.run.id}-{secrets.token_hex(3)}"
        progress.save(update_fields=["remote_id", "updated_at"])

    root, scratch = _staging(_offline(cfg))
    try:
        with _egress(cfg, wb_settings, worker_env=job.worker_env) as proxy:
            _export_run(wandb, job, wb_settings, root, proxy)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    # Only now does W&B hold every logged step.
    if job.steps:
        job.done(job.steps[-1].step)


def _export_run(wandb, job: ExportJob, wb_settings: dict, root: Path, proxy: LocalEgressProxy | None) -> None:
    cfg = job.settings
    wb = _init(
        wandb,
        "run",
        proxy,
        project=cfg.project,
        entity=cfg.entity or None,
        id=job.progress.remote_id,
        resume="allow",
        name=job.run.name,
        tags=list(job.run.tags)[:20],
        config=_run_config(job.run),
        dir=str(root),
        settings=wandb.Settings(**wb_settings),
    )
    try:
        wb.define_metric("val_reward", summary="max")
        for step in job.steps:
            _log_step(wb, job, step)
        if job.final:
            _log_final(wb, job.run)
    except Exception:
        wb.finish(exit_code=1)
        raise
    wb.finish()


def wandb_test_event(*, cfg, secret: str, worker_env: bool, init_timeout: float | None = None) -> str:
    """Log one short run (a single metric) the way an export does; return what W&B said.

    Its own run id, so a test never touches a mirrored run. Raises ExportError with W&B's answer.
    """
    wandb = _import_wandb()
    wb_settings = wandb_settings(cfg, secret, worker_env=worker_env, init_timeout=init_timeout or TEST_INIT_TIMEOUT_S)
    offline = _offline(cfg)
    run_id = f"artweb-test-{secrets.token_hex(4)}"
    root, scratch = _staging(offline)
    try:
        with _egress(cfg, wb_settings, worker_env=worker_env) as proxy:
            wb = _init(
                wandb,
                "test run",
                proxy,
                project=cfg.project,
                entity=cfg.entity or None,
                id=run_id,
                name="artweb connection test",
                tags=["artweb-test"],
                job_type="artweb-test",
                config={"artweb_test": True},
                dir=str(root),
                settings=wandb.Settings(**wb_settings),
            )
            try:
                wb.log({"artweb/test_event": 1})
                where = "/".join(p for p in (wb.entity, wb.project) if p)
                url = "" if offline else (wb.url or "")
            except Exception:
                wb.finish(exit_code=1)
                raise
            wb.finish()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if offline:
        return f"W&B runs offline on this server: test run {run_id} was written to disk for `wandb sync`, not sent."
    return f"W&B accepted test run {run_id} in {where}." + (f" See {url}" if url else "")


def _run_config(run: Run) -> dict:
    return {
        **run.config,
        "artweb": {
            "run_id": run.id,
            "base_model": run.base_model.name,
            "base_model_source": run.base_model.source,
            "scenario_set": run.scenario_set.name,
            "driver": run.driver,  # "client": an ART client rolled out and scored; no script, no reward function
            "script_version": str(run.script_version) if run.script_version else None,
            "reward_version": str(run.reward_version) if run.reward_version else None,
            "num_steps": run.num_steps,
        },
    }


def step_metrics(step: Step) -> dict:
    """The step's numbers under the dashboard's names; wall times under time/."""
    data = {k: v for k, v in (step.metrics or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for name in ("reward_mean", "reward_std", "val_reward"):
        value = getattr(step, name)
        if value is not None:
            data[name] = value
    data["duration_s"] = step.duration_s
    data.update({f"time/{k}": v for k, v in (step.timings or {}).items() if isinstance(v, (int, float))})
    return data


def _log_step(wb, job: ExportJob, step: Step) -> None:
    import wandb

    data = step_metrics(step)
    trajs = (
        Trajectory.objects.filter(run=job.run, step=step.step, group__failed_attempt=False)
        .select_related("group")
        .order_by("group_id", "index")
    )
    n = job.settings.trajectories_per_step
    train = [t for t in trajs if t.group.split == "train"]
    if n and train:
        data["trajectories"] = _table(wandb, _sample(train, n))
    validation = [t for t in trajs if t.group.split == "validation"]
    if validation:
        rewards = [t.reward for t in validation if t.reward is not None]
        data["validation/reward_mean"] = sum(rewards) / len(rewards) if rewards else None
        data["validation/errors"] = sum(1 for t in validation if t.error)
        data["validation/trajectories"] = _table(wandb, validation[:256])
    wb.log({k: v for k, v in data.items() if v is not None}, step=step.step)
    if job.settings.log_checkpoints:
        _log_checkpoint(wandb, wb, job.run, step.step)


def _sample(trajs: list[Trajectory], n: int) -> list[Trajectory]:
    """The best and the worst first, then the rest in order: what a person wants to compare."""
    if len(trajs) <= n:
        return trajs
    ranked = sorted(trajs, key=lambda t: (t.reward is None, -(t.reward or 0.0)))
    picked, lo, hi = [], 0, len(ranked) - 1
    while len(picked) < n:
        picked.append(ranked[lo])
        lo += 1
        if len(picked) < n:
            picked.append(ranked[hi])
            hi -= 1
    return sorted(picked, key=lambda t: (t.group_id, t.index))


def render_messages(messages: list[dict]) -> str:
    lines = []
    for m in messages or []:
        content = m.get("content")
        if not isinstance(content, str):
            content = json.dumps(content) if content else ""
        line = f"[{m.get('role', '?')}] {content}"
        for call in m.get("tool_calls") or []:
            fn = (call or {}).get("function") or {}
            line += f"\n  → {fn.get('name', '')}({fn.get('arguments', '')})"
        lines.append(line)
    text = "\n".join(lines)
    return text if len(text) <= MESSAGE_TEXT_LIMIT else text[:MESSAGE_TEXT_LIMIT] + "…"


def _table(wandb, trajs: list[Trajectory]):
    columns = [
        "step",
        "split",
        "group",
        "index",
        "reward",
        "advantage",
        "completion_tokens",
        "duration_ms",
        "error",
        "conversation",
    ]
    rows = [
        [
            t.step,
            t.group.split,
            t.group_id,
            t.index,
            t.reward,
            t.advantage,
            t.completion_tokens,
            t.duration_ms,
            t.error[:500],
            render_messages(t.messages),
        ]
        for t in trajs
    ]
    return wandb.Table(columns=columns, data=rows)


def _log_checkpoint(wandb, wb, run: Run, step: int) -> None:
    ckpt = Checkpoint.objects.filter(run=run, step=step, state=Checkpoint.State.ACTIVE).first()
    if ckpt is None or not Path(ckpt.path).is_dir():
        return  # retention may have removed it already; nothing to upload
    artifact = wandb.Artifact(
        f"run-{run.id}-lora",
        type="model",
        metadata={"step": step, "val_reward": ckpt.val_reward, **(ckpt.metrics or {})},
    )
    artifact.add_dir(ckpt.path)
    wb.log_artifact(artifact, aliases=[f"step-{step}", "latest"])


def _log_final(wb, run: Run) -> None:
    wb.summary.update(
        {
            "status": run.status,
            "steps_done": run.steps_done,
            "best_val_reward": run.best_val_reward,
            "latest_reward": run.latest_reward,
        }
    )
    if run.error:
        wb.summary["error"] = run.error[:1000]
