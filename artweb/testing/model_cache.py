"""Models' files in a Hugging Face cache, laid out as huggingface_hub lays one out (blobs, a snapshot of
links, refs/main): registering a model by Hub id needs its files there (training.services.model_files),
and nothing here downloads. The files are a real model's, the default one's, linked rather than copied."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# The default model's id on the Hub; its files are what default_model_dir() holds.
DEFAULT_REPO_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def model_files(model_dir: Path, *, weights: bool = True, tokenizer: bool = True) -> dict[str, Path]:
    """The files of the model in model_dir that a worker loads, by name: config, tokenizer, weights."""
    names = ["config.json", *(TOKENIZER if tokenizer else ()), *(["model.safetensors"] if weights else [])]
    return {name: model_dir / name for name in names}


def cache_model(hub: Path, repo_id: str, files: dict[str, Path | bytes]) -> Path:
    """repo_id's "main" snapshot in the cache `hub` (HF_HUB_CACHE), holding `files` (name: a file to link
    to, or the content); returns the snapshot directory. Each file is a blob linked from the snapshot; a
    blob of a file given by path links to that file rather than copying it."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(f"{name}:{commit}".encode()).hexdigest()
        if isinstance(content, bytes):
            blob.write_bytes(content)
        else:
            blob.symlink_to(content)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def link_model(model_dir: Path, into: Path) -> Path:
    """A model directory `into` whose files are links to those of the model in model_dir."""
    into.mkdir(parents=True, exist_ok=True)
    for name, path in model_files(model_dir).items():
        (into / name).symlink_to(path)
    return into
