"""Another processor's code paths taken on this one, for the benchmarks (`--isa avx2`, `--isa avx512`).

`avx2`: what an AVX2-only processor runs (an AMD EPYC before Zen 4, an older Xeon): PyTorch's kernels
(ATEN_CPU_CAPABILITY), oneDNN's (ONEDNN_MAX_CPU_ISA), MKL's (MKL_ENABLE_INSTRUCTIONS), CTranslate2's
(CT2_FORCE_CPU_ISA) and, through bench/isa/sitecustomize.py, vLLM's dispatch and PyTorch's report of
bf16 units. `avx512`: a processor with AVX-512 but no bf16 or AMX units. The clock, caches and memory
stay this machine's: figures compare code paths, not processors.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WANTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni", "avx_vnni")

ISA_ENV = {
    "native": {},
    "avx2": {
        "ARTWEB_BENCH_ISA": "avx2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "CT2_FORCE_CPU_ISA": "AVX2",
        "PYTHONPATH": str(REPO / "bench" / "isa"),
    },
    "avx512": {
        "ARTWEB_BENCH_ISA": "avx512",
        "ATEN_CPU_CAPABILITY": "avx512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "CT2_FORCE_CPU_ISA": "AVX512",
        "PYTHONPATH": str(REPO / "bench" / "isa"),
    },
}


def cpu_flags() -> str:
    """The instruction-set flags that decide the inference and training kernels, as /proc/cpuinfo lists them."""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(f for f in WANTED_FLAGS if f in flags) or "none of " + ", ".join(WANTED_FLAGS)


def reexec_with(isa: str) -> None:
    """Start this command again with `isa`'s code paths unless it already runs with them: the settings
    must be in place before torch loads, and every process the benchmark starts inherits them."""
    if isa == "native" or os.environ.get("ARTWEB_BENCH_ISA") == isa:
        return
    env = {**os.environ, **ISA_ENV[isa]}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (ISA_ENV[isa]["PYTHONPATH"], str(REPO), os.environ.get("PYTHONPATH")) if p
    )
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
