"""The trainer's libraries imported when a worker process starts, not in its first step.

Importing torch, transformers and PEFT (and Unsloth on a GPU worker, which patches transformers as it
loads) is most of a first step's `trainer_load` phase: seconds on a CPU, over half a minute with
Unsloth. The process that will train imports them in a thread of its own as soon as it starts, while
it waits for its first task. A task or a served request that begins meanwhile waits for the warm-up to
finish (wait(): the worker's task_prerun hook and the serving loop call it) before it imports anything:
two threads importing transformers at once can each meet the other's half-initialised modules and fail
with "ImportError: cannot import name ..." (seen: a run's first step, started 5 s after its worker).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time

from django.conf import settings

logger = logging.getLogger(__name__)

# What trainer_for imports, in the order it needs them; the backend's own module after them.
MODULES = ("torch", "transformers", "peft", "training.engine.trainer")
BACKEND_MODULES = {"unsloth": ("unsloth",)}

_thread: threading.Thread | None = None


def modules() -> tuple[str, ...]:
    return MODULES + BACKEND_MODULES.get(settings.ARTWEB["TRAINER_BACKEND"], ())


def _import_all(names: tuple[str, ...]) -> None:
    started = time.perf_counter()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the step's own import will raise it where someone reads it
            logger.warning("warm-up: importing %s failed; the first step will import it", name, exc_info=True)
            return
    logger.info("warm-up: the trainer's libraries imported in %.1f s", time.perf_counter() - started)


def warm_trainer_imports() -> threading.Thread:
    """Start importing the trainer's libraries in a daemon thread (once per process); returns the thread."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_import_all, args=(modules(),), name="artweb-warmup", daemon=True)
        _thread.start()
    return _thread


def wait() -> None:
    """Return once the warm-up's imports are done: at once where none was started, and in the warm-up's
    own thread."""
    thread = _thread
    if thread is not None and thread is not threading.current_thread():
        thread.join()
