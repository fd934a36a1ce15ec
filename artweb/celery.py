"""The Celery app. Queues: "default" for light work, "gpu" for run steps (one per GPU set)."""

import os

from celery import Celery
from celery.signals import celeryd_init, task_prerun, worker_process_init, worker_process_shutdown, worker_ready
from kombu import Exchange, Queue

from training import task_names

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")

app = Celery("artweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Each queue gets its own exchange and key: with a shared one, a message would reach both queues.
app.conf.task_queues = (
    Queue("default", Exchange("default"), routing_key="default"),
    Queue("gpu", Exchange("gpu"), routing_key="gpu"),
)
# Work that needs the inference server or the trainer goes to the GPU workers (training.task_names).
app.conf.task_routes = {name: {"queue": queue} for name, queue in task_names.QUEUES.items()}
app.autodiscover_tasks()


@worker_ready.connect
def _start_sweeper(sender=None, **kwargs) -> None:
    # Every worker runs the periodic sweep (requeue stale runs, send owed messages) in a thread of its
    # main process, one worker at a time under a Redis lock: no beat process to forget (training.sweeper).
    # The same thread marks the worker alive for /metrics, idle or busy.
    from training.sweeper import Sweeper

    Sweeper.start(name=getattr(sender, "hostname", "") or "", queue="gpu" if os.environ.get(_SERVES) else "default")


# The GPU workers serve the OpenAI-compatible endpoint too, from a thread of the process that holds the
# inference server (the pool child under prefork, the worker itself under solo): training.serving.worker.
_SERVES = "ARTWEB_SERVING_WORKER"


@celeryd_init.connect
def _mark_serving(options=None, **kwargs) -> None:
    queues = (options or {}).get("queues") or []
    queues = queues.split(",") if isinstance(queues, str) else queues
    if "gpu" in queues:
        # --pool arrives as pool_cls: a name ("solo") or a class (celery.concurrency.solo.TaskPool).
        pool = (options or {}).get("pool_cls") or "prefork"
        name = pool if isinstance(pool, str) else f"{pool.__module__}.{pool.__name__}"
        os.environ[_SERVES] = "solo" if "solo" in name else "threads" if "thread" in name else "prefork"


@worker_process_init.connect
def _serve_in_child(**kwargs) -> None:
    if os.environ.get(_SERVES):
        _start_gpu_process()


@worker_ready.connect
def _serve_in_worker(**kwargs) -> None:
    if os.environ.get(_SERVES) in ("solo", "threads"):
        _start_gpu_process()


def _start_gpu_process() -> None:
    """In the process that holds the inference server and the trainer: the serving loop, and the trainer
    warmed now (its libraries imported, the next run's trainer loaded) rather than in the first step
    (training.services.warmup)."""
    from training.services.warmup import warm_trainer
    from training.serving.worker import serve_loop_start

    serve_loop_start()
    warm_trainer()


@task_prerun.connect
def _after_warmup(**kwargs) -> None:
    # A task in the process that warms the trainer's imports starts once they are done (training.services.warmup).
    if os.environ.get(_SERVES):
        from training.services.warmup import wait

        wait()


@worker_process_shutdown.connect
def _stop_inference(**kwargs) -> None:
    # A prefork pool child (a GPU worker's) leaves through os._exit, on a SIGTERM as at a warm shutdown:
    # atexit never runs there, and its inference server's merged copies of the weights (hundreds of MB in
    # the temporary directory) would stay behind. This runs in the child just before it exits.
    from training.services import inference

    inference.shutdown()
