"""bench/run_curve.py's PeakMemory: the worker tree's peak resident memory, each page counted once."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.run_curve import PeakMemory

# 400 MiB touched, then a fork that never execs (as the sandbox's start is, between fork and exec) and an
# exec'd child (counted); all three live until killed.
TREE = """
import os, subprocess, sys, time
block = bytearray(400 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("ready", flush=True)
time.sleep(60)
"""


def test_a_fork_before_its_exec_is_not_counted_again():
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert root.stdout.readline().strip() == "ready"
        with PeakMemory(root.pid) as memory:
            time.sleep(2.5)
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(root.pid)], check=False)
        root.wait()
    # The parent's 400 MiB once (~0.4 GiB plus two interpreters), not twice (~0.8 GiB).
    assert 0.39 < memory.peak_gb < 0.6, memory.peak_gb
    assert sum(memory.peak_by_name.values()) == memory.peak_gb
