"""Makes this interpreter take an AVX2-only processor's code paths, for bench/cpu_paths.py.

Loaded by Python at start-up when this folder is on PYTHONPATH. ARTWEB_BENCH_ISA=avx2: PyTorch's and
vLLM's kernel choices (vLLM loads _C_AVX2, its attention and GEMM dispatch skip AVX-512 and AMX) follow
what an AVX2-only processor reports; =avx512: one with AVX-512 but no bf16 or AMX units (vLLM loads
_C_AVX512). ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA, set by the
benchmark beside it, cap PyTorch's own and oneDNN's kernels the same way. The clock, caches and
memory stay this machine's: figures compare paths, not processors.
"""

import os

ABSENT = {
    "avx2": (
        "_is_avx512_supported",
        "_is_avx512_bf16_supported",
        "_is_avx512_vnni_supported",
        "_is_avx512_fp16_supported",
        "_is_amx_tile_supported",
        "_is_amx_fp16_supported",
    ),
    "avx512": (
        "_is_avx512_bf16_supported",
        "_is_avx512_fp16_supported",
        "_is_amx_tile_supported",
        "_is_amx_fp16_supported",
    ),
}

if os.environ.get("ARTWEB_BENCH_ISA") in ABSENT:
    import torch

    for name in ABSENT[os.environ["ARTWEB_BENCH_ISA"]]:
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda: False)
