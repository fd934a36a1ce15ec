"""A GPU worker's training process warms its trainer as it starts (training.services.warmup): it imports the
trainer's libraries, then loads the trainer for the run waiting first, which the process's first step takes
without a load of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from artweb.testing.factories import BaseModelFactory, RunFactory
from tests.training.engine.conftest import default_model_dir, tiny_model_dir, tokenizer  # noqa: F401 (fixtures)
from training.config import run_config_parse
from training.models import Run

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
thread = warmup.warm_trainer()
assert warmup.warm_trainer() is thread  # once per process
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
thread = warmup.warm_trainer()
assert thread.is_alive(), "the warm-up finished before the task could start"
task_prerun.send(sender=None, task_id="t", task=None, args=(), kwargs={})  # a task arriving at once
print("imported before the task's start hook returned:", all(m in sys.modules for m in warmup.modules()))
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
    assert "imported before the task's start hook returned: True" in out.stdout
    assert "imported AutoConfig" in out.stdout


WORKER = """
import json, os, sys, threading, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
import django
django.setup()
from celery.signals import task_prerun
import artweb.celery as app
from training.services import warmup
os.environ[app._SERVES] = "prefork"  # what celeryd_init sets in a GPU worker
# Loads counted (importing the trainer here, before the warm-up: the tests above cover its imports).
from training.engine.trainer import GRPOTrainer
loads, load = [], GRPOTrainer.load
GRPOTrainer.load = lambda self, *a, **k: loads.append(threading.current_thread().name) or load(self, *a, **k)
app._start_gpu_process()  # what a GPU pool child runs on worker_process_init
task_prerun.send(sender=None, task_id="t", task=None, args=(), kwargs={})  # the run's step arrives
from training.models import Run
from training.services import inference
run = Run.objects.select_related("base_model").get(id=int(sys.argv[1]))
warmup._thread.join(300)  # the step's rollouts, long enough for the load
started = time.perf_counter()
trainer = inference.trainer_for(run, checkpoint_dir=None)  # the step's trainer_load phase
print(json.dumps({"trainer_load": time.perf_counter() - started, "loads": loads}))
"""


@pytest.mark.django_db(transaction=True)  # the worker process reads the run from the test database
def test_the_first_step_of_a_started_worker_finds_its_runs_trainer_loaded(alice, tiny_model_dir, tmp_path):  # noqa: F811
    base_model = BaseModelFactory(name="tiny-llama", source=str(tiny_model_dir), local_path=str(tiny_model_dir))
    config = run_config_parse({"group_size": 2, "scenarios_per_step": 2, "num_steps": 2}).model_dump()
    run = RunFactory(owner=alice, base_model=base_model, status=Run.Status.QUEUED, config=config)
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "ARTWEB_DATA_DIR": str(tmp_path),
        "ARTWEB_DEVICE": "cpu",
        "ARTWEB_TRAINER_BACKEND": "peft",
    }
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(run.id)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loads"] == ["artweb-warmup"], out.stderr[-3000:]  # one load, by the warm-up
    assert result["trainer_load"] < 0.05
