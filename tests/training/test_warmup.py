"""A GPU worker's training process imports the trainer's libraries as it starts (training.services.warmup)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
import django
django.setup()
from artweb.celery import _start_gpu_process
from training.services import warmup
assert "training.engine.trainer" not in sys.modules and "peft" not in sys.modules, "imported before the warm-up"
started = time.perf_counter()
_start_gpu_process()  # what a GPU pool child runs on worker_process_init
thread = warmup.warm_trainer_imports()
assert warmup.warm_trainer_imports() is thread  # once per process
thread.join(300)
waited = time.perf_counter() - started
t = time.perf_counter()
from training.engine.trainer import make_trainer
import peft, transformers
print(f"warm-up {waited:.2f} s; the step's imports after it {time.perf_counter() - t:.4f} s")
print("missing:", [m for m in warmup.modules() if m not in sys.modules])
"""


def test_the_training_process_imports_the_trainers_libraries_when_it_starts():
    out = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=400, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout)
    assert "missing: []" in out.stdout
    imports_after = float(out.stdout.split("the step's imports after it ")[1].split(" s")[0])
    assert imports_after < 0.05


ORDER = """
import os, sys, threading, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
import django
django.setup()
from celery.signals import task_prerun
import artweb.celery as app
from training.services import warmup
os.environ[app._SERVES] = "prefork"  # what celeryd_init sets in a GPU worker
warmup.wait()  # nothing started: returns at once
thread = warmup.warm_trainer_imports()
assert thread.is_alive(), "the warm-up finished before the task could start"
task_prerun.send(sender=None, task_id="t", task=None, args=(), kwargs={})  # a task arriving at once
print("alive after the task's start hook:", thread.is_alive())
from transformers import AutoConfig  # what the step's first import was (ImportError when racing)
print("imported", AutoConfig.__name__)
"""


def test_a_task_arriving_during_the_warm_up_waits_for_it():
    """Seen in the Redis fault test: a run's first step, begun 5 s after its worker started, failed with
    "ImportError: cannot import name 'AutoConfig' from 'transformers'" while the warm-up thread was still
    importing transformers. A task in that process now starts once the warm-up is done."""
    out = subprocess.run(
        [sys.executable, "-c", ORDER], cwd=REPO, capture_output=True, text=True, timeout=400, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "alive after the task's start hook: False" in out.stdout
    assert "imported AutoConfig" in out.stdout
