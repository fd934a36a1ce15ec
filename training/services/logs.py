"""Run log lines: persisted first, then broadcast to the run page after commit."""

from __future__ import annotations

import logging

from training.models import RunLog
from training.services.broadcast import log_message, run_broadcast

logger = logging.getLogger("artweb.run")


def run_log(*, run_id: int, message: str, level: str = "INFO", step: int | None = None) -> RunLog:
    line = RunLog.objects.create(run_id=run_id, step=step, level=level, message=message[:10_000])
    logger.log(getattr(logging, level, logging.INFO), message, extra={"run_id": run_id, "step": step})
    run_broadcast(run_id, log_message(line))
    return line
