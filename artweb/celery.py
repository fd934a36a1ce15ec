"""The Celery app. Queues: "default" for light work, "gpu" for run steps (one per GPU set)."""

import os

from celery import Celery
from celery.signals import worker_ready
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
# Work that needs the inference server or the trainer goes to the GPU workers.
app.conf.task_routes = {
    task_names.RUN_STEP: {"queue": "gpu"},
    task_names.DRY_RUN: {"queue": "gpu"},
}
app.autodiscover_tasks()


@worker_ready.connect
def _start_sweeper(**kwargs) -> None:
    # Every worker runs the periodic sweep (requeue stale runs, send owed messages) in a thread of its
    # main process, one worker at a time under a Redis lock: no beat process to forget (training.sweeper).
    from training.sweeper import Sweeper

    Sweeper.start()
