"""bench/run_curve.py's PeakMemory: the worker tree's peak resident memory, each page counted once."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.run_curve import PeakMemory

# 400 MiB touched, then a fork that never execs (as the sandbox's start is, between fork and exec), and an
# exec'd child of the same program that touches 200 MiB of its own; all three live until killed.
CHILD = (
    "import time; b = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    "print('ready', flush=True); time.sleep(60)"
)
TREE = f"""
CHILD = {CHILD!r}
import os, subprocess, sys, time
block = bytearray(400 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_fork_before_its_exec_is_not_counted_again():
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert root.stdout.readline().strip() == "ready"
        with PeakMemory(root.pid) as memory:
            time.sleep(2.5)
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(root.pid)], check=False)
        root.wait()
    # The parent's 400 MiB once and the exec'd child's 200 MiB (~0.6 GiB with the interpreters): not the
    # parent's twice (~1.0 GiB), and not without the child (~0.4 GiB).
    assert 0.59 < memory.peak_gb < 0.8, memory.peak_gb
    assert sum(memory.peak_by_name.values()) == pytest.approx(memory.peak_gb)
