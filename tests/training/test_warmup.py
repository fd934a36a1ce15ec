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
