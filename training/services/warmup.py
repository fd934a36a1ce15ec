"""The trainer warmed when a worker process starts, not in its first step: its libraries imported, then the
trainer loaded for the run a step will most likely take next.

Importing torch, transformers and PEFT (and Unsloth on a GPU worker, which patches transformers as it
loads) and loading the base weights are a first step's `trainer_load` phase: seconds on a CPU, over half a
minute each at 7B with Unsloth. The process that will train does both in a thread of its own as soon as it
starts, while it waits for its first task.

Imports: a task or a served request that begins meanwhile waits for them to finish (wait(): the worker's
task_prerun hook and the serving loop call it) before it imports anything: two threads importing
transformers at once can each meet the other's half-initialised modules and fail with "ImportError: cannot
import name ..." (seen: a run's first step, started 5 s after its worker).

The trainer (trainer_preload): for the first run of the fair queue (training.selectors_queue.waiting_runs),
at its latest committed checkpoint, as its step would ask for it. The run is chosen before wait() lets a
task start, so that a step message already queued claims that same run rather than race the choice. Then
tasks start while the load goes on: a step's rollouts run beside it, and a step that needs the trainer
before the load is done waits for it (training.services.trainer_pool); its trainer_load phase is then that
wait. A step of another run takes the trainer as any step takes the one loaded before it (the same model:
its state swapped in; another: the base model loaded anew). On a GPU the trainer is loaded only where the
run's update fits beside the inference server the step will start (the step's own fit check, with the
server's weights and KV cache left to it when it does not run yet). A warm-up only reads the database:
when no run waits it loads nothing, and a failure is logged and left to the step, which meets it again.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connections

from training.models import Run
from training.selectors_queue import waiting_runs
from training.services import inference, trainer_pool
from training.services.steps.execute import _latest_checkpoint  # the step's own rule: its trainer key matches

logger = logging.getLogger(__name__)

# What trainer_for imports, in the order it needs them; the backend's own module after them.
MODULES = ("torch", "transformers", "peft", "training.engine.trainer")
BACKEND_MODULES = {"unsloth": ("unsloth",)}

_thread: threading.Thread | None = None
_imported = threading.Event()  # the imports are done (or given up) and the run to preload chosen: tasks may start


def modules() -> tuple[str, ...]:
    return MODULES + BACKEND_MODULES.get(settings.ARTWEB["TRAINER_BACKEND"], ())


def _import_all(names: tuple[str, ...]) -> bool:
    started = time.perf_counter()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the step's own import will raise it where someone reads it
            logger.warning("warm-up: importing %s failed; the first step will import it", name, exc_info=True)
            return False
    logger.info("warm-up: the trainer's libraries imported in %.1f s", time.perf_counter() - started)
    return True


def _warm() -> None:
    try:
        if _import_all(modules()):
            trainer_preload(ready=_imported.set)
    finally:
        _imported.set()
        connections.close_all()  # this thread's own database connection


def warm_trainer() -> threading.Thread:
    """Start warming the trainer in a daemon thread (once per process): its imports, then trainer_preload.
    Returns the thread."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_warm, name="artweb-warmup", daemon=True)
        _thread.start()
    return _thread


def wait() -> None:
    """Return once the warm-up's imports are done and its run chosen (not its load: trainer_for waits for
    that): at once where none was started, and in the warm-up's own thread."""
    if _thread is not None and _thread is not threading.current_thread():
        _imported.wait()


def trainer_preload(*, ready: Callable[[], None] | None = None) -> bool:
    """Load the trainer for the first run waiting in the fair queue, at its latest committed checkpoint, as
    its step will ask for it (inference.trainer_for). True when it did; False, logged, when no run waits, a
    trainer is loaded already, the run's update would not fit here, or the load failed. Never raises; only
    reads the database. `ready()` (an Event's set: it may be called twice) is called once the run is chosen,
    with the pool held when it loads one (so that a step it lets in waits for this load), and in any case
    before returning."""
    from training.engine.fit import TrainerDoesNotFit  # here: it imports torch, which the warm-up imports first

    run = None
    try:
        chosen = _next_run()
        if chosen is None:
            logger.info("warm-up: no run waits for a step; no trainer loaded until one does")
            return False
        run, checkpoint_dir = chosen
        _fit_check(run)
        with trainer_pool.trainer_preload() as free:
            if ready is not None:
                ready()
            if not free:
                logger.info("warm-up: a step loaded the trainer first; run %s's is not loaded", run.id)
                return False
            started = time.perf_counter()
            inference.trainer_for(run, checkpoint_dir=checkpoint_dir)
        logger.info(
            "warm-up: trainer loaded for run %s at step %s in %.1f s",
            run.id,
            run.steps_done,
            time.perf_counter() - started,
        )
        return True
    except TrainerDoesNotFit as exc:
        logger.info("warm-up: run %s's trainer not loaded, as its update would not fit here: %s", run.id, exc)
    except Exception:  # its step meets the same failure and reports it on the run
        what = (
            f"run {run.id}'s trainer could not be loaded" if run is not None else "the waiting runs could not be read"
        )
        logger.warning("warm-up: %s; no trainer loaded, a step loads its own", what, exc_info=True)
    finally:
        if ready is not None:
            ready()
    return False


def _next_run():
    """(the run a step would take next, its latest committed checkpoint's directory or None), or None when no
    run waits."""
    waiting = waiting_runs()
    if not waiting:
        return None
    run = Run.objects.select_related("base_model").get(id=waiting[0].run_id)
    checkpoint = _latest_checkpoint(run)
    return run, checkpoint.path if checkpoint else None


def _fit_check(run) -> None:
    """fit.TrainerDoesNotFit where the run's update would not fit on this worker's GPU beside the inference
    server its step uses: the step's own check (inference.trainer_fit_check); and where that server is to
    share the card but does not run yet (a worker that just started), its weights and the KV cache the step
    will size for it are left out of what the check counts as free. Nothing on a CPU."""
    from training.engine import fit

    inference.trainer_fit_check(run)
    conf = settings.ARTWEB
    device = str(conf["DEVICE"])
    if not device.startswith("cuda") or conf["VLLM_CUDA_DEVICES"]:
        return
    if inference._server_model is not None and inference._server_model == inference._served_as(run.base_model):
        return  # the server runs: the check counted it
    try:
        shape = fit.ModelShape.from_config(fit.read_model_config(inference.base_model_path(run.base_model)))
    except ValueError:
        return  # a shape the estimate cannot read: trainer_fit_check let it through too
    server = shape.parameters() * 2 + int(inference.kv_cache_for(run.base_model, run) * fit.GiB)  # bf16 weights
    memory = fit.plan_for(inference._train_config(run), shape, fit.cuda_available(device) - server, device)
    if not memory.fits:
        raise fit.TrainerDoesNotFit(
            f"{fit.gib(memory.available)} would be left beside the inference server's {fit.gib(server)} "
            f"(its weights and KV cache); the update needs about {fit.gib(memory.need(fit.MIN_FIT_TOKENS))}"
        )
