"""Export targets (create, change, test, delete) and the export itself: bring one target up to date with
one run.

export_sync is what the Celery task calls. It runs on the "default" queue, never in the GPU worker, and
touches no row of the run except the timeline (RunEvent): a failing service cannot change a run's result.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings as django_settings
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.utils import timezone

from artweb.errors import ApplicationError
from artweb.visibility import may_change, require_visible
from rollouts.sandbox.egress import EgressRefused, egress_url_check
from training.exports.base import ExportError, ExportJob
from training.exports.crypto import secret_encrypt
from training.exports.langfuse import langfuse_export, langfuse_test_event
from training.exports.schemas import export_settings_parse
from training.exports.selectors import export_target_secret, export_target_uses_worker_env, export_targets_for_run
from training.exports.wandb import wandb_export, wandb_test_event
from training.exports.weave import weave_test_event
from training.models import ExportProgress, ExportTarget, Run, Step
from training.services.runs import run_event

logger = logging.getLogger(__name__)

LOCK_SECONDS = 15 * 60  # longer than any one export attempt (the task's time limit)


# ---- targets ---------------------------------------------------------------------------------------------


def _check_run(owner, run: Run | None) -> None:
    """A target may be for any run its owner may see."""
    if run is not None:
        require_visible(owner, run, what="run", field="run")


# The setting of each kind that names a server to connect to.
URL_FIELDS = {
    ExportTarget.Kind.WANDB: "base_url",
    ExportTarget.Kind.WEAVE: "base_url",
    ExportTarget.Kind.LANGFUSE: "host",
}


def _check_server(kind: str, parsed) -> None:
    """A server the egress guard refuses now is refused when saved, naming the address and the setting
    that would allow it. Every connection is checked again when it is made; that is the check that counts."""
    name = URL_FIELDS[kind]
    url = getattr(parsed, name, "")
    if not url:
        return
    try:
        egress_url_check(url, django_settings.ARTWEB_EGRESS)
    except EgressRefused as exc:
        raise ApplicationError(
            f"Export settings: settings.{name}: {exc}", field_errors={f"settings.{name}": [str(exc)]}
        ) from None


def _set_secret(target: ExportTarget, secret: str) -> None:
    secret = secret.strip()
    if len(secret) > 1000:
        raise ApplicationError("That key is too long (1000 characters at most).", field_errors={"secret": ["too long"]})
    target.secret_encrypted = secret_encrypt(secret) if secret else ""
    target.secret_last4 = secret[-4:] if len(secret) >= 8 else ""  # a short secret shows nothing of itself


@transaction.atomic
def export_target_create(
    *, owner, kind: str, settings: dict | None = None, secret: str = "", run: Run | None = None, enabled: bool = True
) -> ExportTarget:
    """A new target for all of owner's runs (run=None) or for one run. secret empty: none is stored (only
    the operator's own targets then take one from the worker's environment)."""
    parsed = export_settings_parse(kind, settings)
    _check_server(kind, parsed)
    _check_run(owner, run)
    target = ExportTarget(owner=owner, run=run, kind=kind, enabled=enabled, settings=parsed.model_dump())
    _set_secret(target, secret or "")
    try:
        with transaction.atomic():
            target.save()
    except IntegrityError as exc:
        where = f"run {run.id}" if run else "your runs"
        raise ApplicationError(
            f"There is already a {ExportTarget.Kind(kind).label} export for {where}; change that one.",
            field_errors={"kind": ["exists"]},
        ) from exc
    return target


@transaction.atomic
def export_target_update(
    *, target: ExportTarget, actor, settings: dict | None = None, secret: str | None = None, enabled: bool | None = None
) -> ExportTarget:
    """secret None keeps the stored key, "" removes it (as at creation, only the operator's own targets
    then take one from the worker's environment)."""
    if not may_change(actor, target):
        raise ApplicationError("That export is not yours.")
    if settings is not None:
        parsed = export_settings_parse(target.kind, settings)
        _check_server(target.kind, parsed)
        target.settings = parsed.model_dump()
    if secret is not None:
        _set_secret(target, secret)
    if enabled is not None:
        target.enabled = enabled
    # A changed target deserves a fresh start: the next attempt shows whether the change fixed it.
    target.last_error, target.last_error_at = "", None
    target.save()
    return target


@transaction.atomic
def export_target_delete(*, target: ExportTarget, actor) -> None:
    if not may_change(actor, target):
        raise ApplicationError("That export is not yours.")
    target.delete()


@dataclass(frozen=True)
class ExportTestResult:
    ok: bool
    message: str  # what the service answered, or why nothing was sent; the key never appears in it


def _tester(kind: str) -> Callable[..., str]:
    if kind == ExportTarget.Kind.WANDB:
        return wandb_test_event
    if kind == ExportTarget.Kind.WEAVE:
        return weave_test_event

    return langfuse_test_event


def export_target_test(*, target: ExportTarget, actor) -> ExportTestResult:
    """Send one real test event to the target with its stored settings and key, and say how it went.

    A failure is an answer, not an error: the result carries the service's message. Either way it is
    noted on the target (last_success_at / last_error), as an export attempt's would be. No transaction
    around it: the network call may take seconds and holds no rows.
    """
    if not may_change(actor, target):
        raise ApplicationError("That export is not yours.")
    secret = ""
    try:
        secret = export_target_secret(target)
        message = _tester(target.kind)(
            cfg=export_settings_parse(target.kind, target.settings),
            secret=secret,
            worker_env=export_target_uses_worker_env(target),
        )
        result = ExportTestResult(ok=True, message=message)
    except ApplicationError as exc:  # settings stored before a schema change no longer validate
        result = ExportTestResult(
            ok=False,
            message=f"The stored settings are not valid any more: {exc.message} Edit the export and save it again.",
        )
    except Exception as exc:
        message = str(exc) if isinstance(exc, ExportError) else f"{type(exc).__name__}: {exc}"
        result = ExportTestResult(ok=False, message=_scrub(message, secret))
    now = timezone.now()
    if result.ok:
        ExportTarget.objects.filter(id=target.id).update(last_error="", last_error_at=None, last_success_at=now)
    else:
        ExportTarget.objects.filter(id=target.id).update(last_error=f"Test event: {result.message}", last_error_at=now)
    logger.info(
        "export target test: %s",
        "ok" if result.ok else "failed",
        extra={"export_target": target.id, "kind": target.kind},
    )
    return result


# ---- the export ------------------------------------------------------------------------------------------


def _exporter(kind: str) -> Callable[[ExportJob], None] | None:
    if kind == ExportTarget.Kind.WANDB:
        return wandb_export
    if kind == ExportTarget.Kind.LANGFUSE:
        return langfuse_export
    return None  # Weave traces are written by the rollout scripts themselves, inside the sandbox


@contextmanager
def _lock(target_id: int, run_id: int) -> Iterator[bool]:
    """One export of a (target, run) at a time, across workers: a service sees steps in order."""
    key, token = f"artweb:export-lock:{target_id}:{run_id}", uuid.uuid4().hex
    got = cache.add(key, token, timeout=LOCK_SECONDS)
    try:
        yield got
    finally:
        if got and cache.get(key) == token:
            cache.delete(key)


def _pending(progress: ExportProgress, run: Run) -> bool:
    return Step.objects.filter(run=run, step__gt=progress.last_step).exists() or (
        run.status in Run.FINAL_STATUSES and not progress.finished
    )


def export_sync(*, target_id: int, run_id: int) -> int:
    """Export every step after the cursor and, once the run has ended, its end. Returns steps exported.

    Raises ExportError (after recording it) when the service fails; the caller retries with backoff.
    A call that finds another export of the same target and run in progress leaves the work to it: that
    one checks for new steps after letting go of the lock, so nothing committed before this call is missed.
    """
    target = ExportTarget.objects.select_related("owner").filter(id=target_id).first()
    run = (
        Run.objects.select_related("base_model", "scenario_set", "script_version", "reward_version")
        .filter(id=run_id)
        .first()
    )
    exporter = _exporter(target.kind) if target else None
    if target is None or run is None or exporter is None or not target.enabled:
        return 0
    progress, _ = ExportProgress.objects.get_or_create(target=target, run=run)
    exported = 0
    while True:
        with _lock(target.id, run.id) as got:
            if not got:
                return exported
            exported += _sync_once(target, run, exporter)
        progress.refresh_from_db()
        run.refresh_from_db()
        if not _pending(progress, run):
            return exported


def _sync_once(target: ExportTarget, run: Run, exporter) -> int:
    progress = ExportProgress.objects.get(target=target, run=run)
    run.refresh_from_db()
    final = run.status in Run.FINAL_STATUSES and not progress.finished
    steps = list(Step.objects.filter(run=run, step__gt=progress.last_step).order_by("step"))
    if not steps and not final:
        return 0
    done_steps: list[int] = []

    def done(step: int) -> None:
        ExportProgress.objects.filter(id=progress.id, last_step__lt=step).update(last_step=step)
        progress.last_step = step
        done_steps.append(step)

    secret = ""
    try:
        secret = export_target_secret(target)
        job = ExportJob(
            target=target,
            run=run,
            progress=progress,
            steps=steps,
            final=final,
            settings=export_settings_parse(target.kind, target.settings),
            secret=secret,
            done=done,
            worker_env=export_target_uses_worker_env(target),
        )
        exporter(job)
    except Exception as exc:  # anything an exporter raises is a failed attempt, never a crash
        message = str(exc) if isinstance(exc, ExportError) else f"{type(exc).__name__}: {exc}"
        message = _scrub(message, secret)
        export_failure_record(target=target, run=run, progress=progress, message=message)
        raise ExportError(message) from exc
    if final:
        ExportProgress.objects.filter(id=progress.id).update(finished=True)
    export_success_record(target=target, run=run, progress=progress)
    last = max(done_steps, default=0)
    return sum(1 for s in steps if s.step <= last)


def _scrub(message: str, secret: str) -> str:
    if secret and len(secret) >= 4:
        message = message.replace(secret, "••••")
    return message[:2000]


def _gist(message: str) -> str:
    """An error's first line without its numbers (ports, attempt counts, ids): what makes it a new error."""
    return re.sub(r"\d+", "#", message.strip().split("\n", 1)[0])[:200]


def export_failure_record(*, target: ExportTarget, run: Run, progress: ExportProgress, message: str) -> None:
    """Note the failure on the target and the run's progress; tell the run page once per new error."""
    now = timezone.now()
    progress.refresh_from_db()
    new = progress.failures == 0 or _gist(progress.last_error) != _gist(message)
    ExportProgress.objects.filter(id=progress.id).update(
        failures=progress.failures + 1, last_error=message, last_error_at=now
    )
    ExportTarget.objects.filter(id=target.id).update(last_error=message, last_error_at=now)
    logger.warning(
        "export to %s failed: %s", target.kind, message, extra={"run_id": run.id, "export_target": target.id}
    )
    if new:
        run_event(
            run=run,
            kind="export_warning",
            message=f"{ExportTarget.Kind(target.kind).label} export failed: {message} Retrying with backoff; "
            "the run itself is not affected.",
            data={"target": target.id, "kind": target.kind, "error": message, "attempt": progress.failures + 1},
        )


def export_success_record(*, target: ExportTarget, run: Run, progress: ExportProgress) -> None:
    progress.refresh_from_db()
    if progress.failures:
        ExportProgress.objects.filter(id=progress.id).update(failures=0, last_error="", last_error_at=None)
        run_event(
            run=run,
            kind="export_recovered",
            message=f"{ExportTarget.Kind(target.kind).label} export works again; exported up to step {progress.last_step}.",
            data={"target": target.id, "kind": target.kind},
        )
    ExportTarget.objects.filter(id=target.id).update(last_error="", last_error_at=None, last_success_at=timezone.now())


def export_targets_to_sync(*, run_id: int) -> list[int]:
    run = Run.objects.filter(id=run_id).first()
    if run is None:
        return []
    return [t.id for t in export_targets_for_run(run=run) if _exporter(t.kind) is not None]
