"""Structured logging: JSON lines in production, readable lines in development, and the run and step a
line is about on every line a worker writes.

The ids come from a context (contextvars), so code deep in a step needs no `extra=`:

    with log_context(run_id=run.id, step=step):
        ...every log call in here, from any module, carries run_id and step...

Celery tasks whose arguments include run_id (and step) get that context bound for the task's duration,
plus task name and id. An explicit `extra={"run_id": ...}` on a call wins over the context.

Wiring (settings.LOGGING): the handler gets ContextFilter, and JsonFormatter or ConsoleFormatter.
"""

from __future__ import annotations

import inspect
import json
import logging
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

CONTEXT_FIELDS = ("run_id", "step", "task", "task_id")
_context: ContextVar[dict | None] = ContextVar("artweb_log_context", default=None)

# The attributes every LogRecord has; anything else on a record came from `extra=` and is worth keeping.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "ids", *CONTEXT_FIELDS}


@contextmanager
def log_context(**fields):
    """Bind fields (None values are ignored) to every log line written inside the block."""
    token = _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def current_log_context() -> dict:
    return dict(_context.get() or {})


class ContextFilter(logging.Filter):
    """Puts run_id, step, task and task_id on every record: from `extra=` if given, else the context."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _context.get() or {}
        for key in CONTEXT_FIELDS:
            if getattr(record, key, None) is None:
                setattr(record, key, ctx.get(key))
        return True


def _utc(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, run_id, step, task, task_id, process, extras."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": _utc(record), "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        out["process"] = record.process
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    """`12:00:01.123 INFO    training.services.steps [run 7 step 3] message` for a terminal."""

    def __init__(self, *args, **kwargs):
        super().__init__(fmt="%(asctime)s %(levelname)-7s %(name)s %(ids)s%(message)s", datefmt="%H:%M:%S")

    def formatTime(self, record, datefmt=None):
        return super().formatTime(record, datefmt) + f".{int(record.msecs):03d}"

    def format(self, record: logging.LogRecord) -> str:
        parts = []
        if getattr(record, "run_id", None) is not None:
            parts.append(f"run {record.run_id}")
        if getattr(record, "step", None) is not None:
            parts.append(f"step {record.step}")
        record.ids = f"[{' '.join(parts)}] " if parts else ""
        return super().format(record)


# ---- Celery: bind run_id/step (when a task takes them) and the task's name and id ----------------------------

_task_tokens: dict[str, object] = {}


def _task_context(task, args, kwargs) -> dict:
    fields = {"task": getattr(task, "name", None)}
    try:
        bound = inspect.signature(task.run).bind_partial(*(args or ()), **(kwargs or {})).arguments
    except (TypeError, ValueError):
        bound = kwargs or {}
    for key in ("run_id", "step"):
        if bound.get(key) is not None:
            fields[key] = bound[key]
    return fields


def _on_task_prerun(sender=None, task_id=None, task=None, args=None, kwargs=None, **_):
    fields = _task_context(task or sender, args, kwargs)
    _task_tokens[task_id] = _context.set({**(_context.get() or {}), **fields, "task_id": task_id})


def _on_task_postrun(sender=None, task_id=None, **_):
    token = _task_tokens.pop(task_id, None)
    if token is not None:
        try:
            _context.reset(token)
        except ValueError:  # set in another context (a thread pool); drop it instead
            _context.set({})


def connect_celery_signals() -> None:
    """Idempotent. Called at import: LOGGING imports this module in every process, workers included."""
    try:
        from celery import signals
    except ImportError:  # pragma: no cover - celery is a dependency; a bare script may lack it
        return
    signals.task_prerun.connect(_on_task_prerun, weak=False, dispatch_uid="artweb.logging.prerun")
    signals.task_postrun.connect(_on_task_postrun, weak=False, dispatch_uid="artweb.logging.postrun")


connect_celery_signals()
