"""The jail's start-up time with and without its seccomp filter: the median over N starts of a jailed
/bin/true, and the CPU it was measured on.

    python bench/jail_start.py             # 30 starts of each kind
    python bench/jail_start.py --runs 100

Two figures each way. "batch": a jail built (uid lease, staging, cgroup), one jailed /bin/true run to its
end, the jail removed: what every batch pays before Python starts (bench/rollout_bench.py's "jail
start-up" measures the same). "process": one more jailed /bin/true in a jail already built: what each
sandbox process of a batch pays. Starts with and without the filter alternate, so a machine that gets
busier or quieter meanwhile weighs on both alike. Target: under 100 ms with the filter.

Needs what the worker needs: root, bubblewrap and libseccomp.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rollouts.sandbox import seccomp
from rollouts.sandbox.jail import Jail, JailConfig, JailLimits
from rollouts.sandbox.mounts import FALLBACKS_DIR, GUEST_DIR


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next(
        (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "unknown"
    )


def jailed_true(jail: Jail, files_dir: Path, *, filtered: bool) -> None:
    fd = seccomp.filter_fd() if filtered else -1
    try:
        argv = jail.command(files_dir, ["/bin/true"], seccomp_fd=fd)
        if not filtered:  # the jail as it was before the filter: the same command without --seccomp
            at = argv.index("--seccomp")
            del argv[at : at + 2]
        subprocess.run(
            argv,
            check=True,
            pass_fds=(fd,) if filtered else (),
            preexec_fn=jail.preexec(cpu_seconds=10, file_mb=1),
        )
    finally:
        if filtered:
            os.close(fd)


def build(root: Path, config: JailConfig) -> Jail:
    jail = Jail(
        config=config,
        root=root,
        socket_dir=root / "sock",
        guest_dir=GUEST_DIR,
        fallbacks_dir=FALLBACKS_DIR,
        python=sys.executable,
        limits=JailLimits(memory_mb=2048, processes=96, cpus=1.0),
    )
    for path in (root / "shared", root / "shared/box", root / "sock"):
        os.chown(path, jail.uid, jail.uid)
    return jail


def work_root(tmp: str) -> Path:
    root = Path(tmp)
    root.chmod(0o711)
    for d in ("shared/box", "sock"):
        (root / d).mkdir(parents=True)
    return root


def batch_ms(config: JailConfig, *, filtered: bool) -> float:
    with tempfile.TemporaryDirectory(prefix="artweb-bench-jail-") as tmp:
        root = work_root(tmp)
        started = time.perf_counter()
        jail = build(root, config)
        try:
            jailed_true(jail, root / "shared/box", filtered=filtered)
        finally:
            jail.close()
        return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="starts of each kind (default 30)")
    args = parser.parse_args()
    config = JailConfig()

    started = time.perf_counter()
    seccomp._build(__import__("pyseccomp"))
    print(
        f"seccomp filter: {len(seccomp.filter_program()) // 8} BPF instructions, built in "
        f"{(time.perf_counter() - started) * 1000:.1f} ms (once per worker process)"
    )
    batch_ms(config, filtered=True)  # the jail's one-time checks (a probe jail) out of the figures

    batches: dict[bool, list[float]] = {True: [], False: []}
    processes: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.runs):
        for filtered in (True, False):
            batches[filtered].append(batch_ms(config, filtered=filtered))
    with tempfile.TemporaryDirectory(prefix="artweb-bench-jail-") as tmp:
        root = work_root(tmp)
        jail = build(root, config)
        try:
            for _ in range(args.runs):
                for filtered in (True, False):
                    t = time.perf_counter()
                    jailed_true(jail, root / "shared/box", filtered=filtered)
                    processes[filtered].append((time.perf_counter() - t) * 1000)
        finally:
            jail.close()

    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs)")
    print(f"median of {args.runs} starts of a jailed /bin/true, ms:")
    print(f"  {'':28}{'with filter':>12}{'without':>10}")
    for name, figures in (("batch (jail built, removed)", batches), ("process (jail already built)", processes)):
        print(f"  {name:28}{statistics.median(figures[True]):12.1f}{statistics.median(figures[False]):10.1f}")


if __name__ == "__main__":
    main()
