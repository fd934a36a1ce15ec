"""Which CPU inference server suits this processor, measured once and kept beside the data.

vLLM's CPU build computes in bf16: fast on processors with bf16 units (AMX, AVX512-BF16), several times
slower where bf16 is emulated (AVX2-only processors). artweb's CTranslate2 server computes in fp32, which
every processor runs at full speed. Both servers spend a decode step in the same matrix products, so
the probe times those products, at a decode step's shape, in each dtype: when bf16 products run faster
than fp32 ones, vLLM is the faster server (on an Intel Xeon with AMX: vLLM 150-195 tok/s against
CTranslate2's ~100 for 16 rollouts of the default model), otherwise CTranslate2 is (the AVX2 code
paths: vLLM 22-35 tok/s, CTranslate2 ~100; bench/results/cpu_paths.md).

The result is kept in a JSON file keyed by the processor's model, its flags, torch's version and the
kernels torch picks, so
a worker probes once per machine (about a second). ARTWEB_INFERENCE_ENGINE overrides it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

ENGINES = ("vllm", "ctranslate2")
# Flags that decide which kernels the inference servers can use.
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "avx_vnni")
# One decode step's products for 16 sequences of a small model: (rows, inner, outer).
SHAPES = ((16, 576, 1536), (16, 1536, 576), (16, 576, 4096))


@dataclass(frozen=True)
class Choice:
    engine: str  # one of ENGINES
    reason: str  # one line for the log and the benchmark's header
    bf16_gflops: float | None = None
    fp32_gflops: float | None = None


def cpu_identity() -> dict:
    """The processor's model name and the instruction-set flags that matter here (from /proc/cpuinfo)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"model": model, "flags": [f for f in FLAGS if f in flags], "cores": os.cpu_count() or 1}


def _gflops(dtype, seconds: float = 0.25) -> float:
    """Sustained GFLOP/s of the decode-step products in `dtype` over about `seconds`."""
    import torch

    pairs = [(torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)) for m, k, n in SHAPES]
    flops = sum(2 * m * k * n for m, k, n in SHAPES)
    for a, b in pairs:  # the first call picks and builds its kernels
        torch.matmul(a, b)
    rounds, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for a, b in pairs:
            torch.matmul(a, b)
        rounds += 1
    return rounds * flops / (time.perf_counter() - start) / 1e9


def measure() -> Choice:
    import torch

    # One thread: the kernels' own speed, not how quickly a pool of threads wakes on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bf16, fp32 = _gflops(torch.bfloat16), _gflops(torch.float32)
    finally:
        torch.set_num_threads(threads)
    if bf16 > fp32:
        engine, why = "vllm", "bf16 products run faster than fp32 here, as vLLM's CPU build computes"
    else:
        engine, why = "ctranslate2", "bf16 products run no faster than fp32 here (no bf16 units): fp32 CTranslate2"
    reason = f"{why} (bf16 {bf16:.1f} GFLOP/s, fp32 {fp32:.1f} GFLOP/s)"
    return Choice(engine=engine, reason=reason, bf16_gflops=round(bf16, 2), fp32_gflops=round(fp32, 2))


def choose(setting: str, *, cache_file: str | os.PathLike | None) -> Choice:
    """The CPU inference server to start. setting: "auto" (probe, or the kept result of an earlier probe on
    this processor), "vllm" or "ctranslate2"."""
    if setting in ENGINES:
        return Choice(engine=setting, reason=f"set by ARTWEB_INFERENCE_ENGINE={setting}")
    if setting != "auto":
        raise ValueError(f"ARTWEB_INFERENCE_ENGINE is one of auto, {', '.join(ENGINES)}; got {setting!r}")
    import torch

    # The kernels PyTorch picks: a setting that caps them (ATEN_CPU_CAPABILITY) takes other code paths on
    # the same processor, and a result measured one way must not be read back the other.
    kernels = torch.backends.cpu.get_cpu_capability()
    key = json.dumps({**cpu_identity(), "torch": torch.__version__, "kernels": kernels}, sort_keys=True)
    path = Path(cache_file) if cache_file else None
    kept = {}
    if path is not None and path.exists():
        try:
            kept = json.loads(path.read_text())
        except ValueError:
            kept = {}
    if key in kept:
        return Choice(**kept[key])
    choice = measure()
    logger.info("CPU inference: %s, %s", choice.engine, choice.reason)
    if path is not None:
        kept[key] = asdict(choice)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(kept, indent=1))
        os.replace(partial, path)
    return choice
