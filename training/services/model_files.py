"""A base model's files, found where the workers will load them from and checked before it is registered.

The workers hand the inference server and the trainer `inference.base_model_path()`: a directory on the
server, or a Hugging Face id that vLLM and transformers look up in the local Hugging Face cache (HF_HOME,
HF_HUB_CACHE). artweb's machines do not download from the Hub, so an id is usable only if its snapshot
is in that cache. model_files_check finds the files the same way, without the network, and checks what
a worker's start would trip on: a config.json transformers reads as a causal language model, a
tokenizer, complete weights, and weights that fit the workers' memory. Each failure is an
ApplicationError on the `source` field that says what to do, and names no directory of the server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from artweb.errors import ApplicationError
from rollouts.inference.inference_server import without_host_paths

# The weight files transformers loads (transformers.utils' names), in the order it looks for them; vLLM
# reads the same files. An index names the shards of a model split into several files.
WEIGHT_FILES = (
    "model.safetensors.index.json",
    "model.safetensors",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
)
# A worker on a CPU holds the weights twice: in its inference server and in its trainer.
WEIGHT_COPIES = 2
GIB = 2**30


@dataclass(frozen=True)
class ModelFiles:
    directory: Path  # where the files are: the server directory, or the Hub id's snapshot in the cache
    architecture: str
    weight_files: tuple[str, ...]  # names relative to directory
    weight_bytes: int


def is_server_path(source: str) -> bool:
    """Whether a base model's source is written as a directory on the server rather than a Hub id."""
    return source.startswith(("/", ".", "~"))


def source_shown(source: str, user) -> str:
    """A base model's source as `user` may see it: a directory on the server (the default model's, a staff
    member's registration) is the server's own path, shown to staff only."""
    return "a directory on the server" if is_server_path(source) and not getattr(user, "is_staff", False) else source


def model_files_check(path: str) -> ModelFiles:
    """Check the model at `path` (inference.base_model_path: a server directory or a Hugging Face id)
    as a worker would load it; return what was found, or raise ApplicationError saying what to fix."""
    directory, label = model_directory(path)
    architecture = _check_config(directory, label)
    _check_tokenizer(directory, label)
    files, size = _weights(directory, label)
    _check_size(size, label=label)
    return ModelFiles(directory=directory, architecture=architecture, weight_files=files, weight_bytes=size)


def model_directory(path: str) -> tuple[Path, str]:
    """(the directory holding the model's files, how a message names the model) for `path` as the
    workers take it: a directory on the server as it is, a Hub id as its snapshot in the local Hugging
    Face cache (the "main" revision, which is what the inference server loads). No network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    local = Path(path).expanduser()
    # The inference server reads an existing path as a directory (vllm_server.environment sets
    # HF_HUB_OFFLINE by the same test); one written as a path that is not there is a typo, not an id.
    if local.exists() or is_server_path(path):
        if not local.is_dir():
            raise _error("The directory given does not exist on the server; check its path.", "not a model directory")
        return local, "the model directory"
    try:
        return Path(snapshot_download(path, local_files_only=True)), f"the model {path}"
    except HFValidationError:
        raise _error(
            f"{path!r} is not a Hugging Face model id; give one as org/name, e.g. Qwen/Qwen2.5-0.5B-Instruct.",
            "not a Hugging Face model id",
        ) from None
    except LocalEntryNotFoundError:
        raise _error(
            f"The model {path} is not in this server's model cache, and artweb does not download models from "
            f"the Hugging Face Hub. Ask an administrator to download it into the server's Hugging Face cache "
            f"(hf download {path}), then register it again.",
            "not in this server's model cache",
        ) from None


def _check_config(directory: Path, label: str) -> str:
    """config.json as transformers reads it: a model type it knows, of a causal language model (what the
    trainer's AutoModelForCausalLM loads), with an architecture vLLM serves as one. Returns the architecture."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not (directory / "config.json").is_file():
        raise _error(
            f"{label} has no config.json, the file that names its architecture.",
            "not a model directory (no config.json)",
        )
    try:
        raw = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise _error(
            f"The config.json of {label} is not valid JSON ({_reason(exc)}).", "config.json unreadable"
        ) from None
    if not isinstance(raw, dict):
        raise _error(f"The config.json of {label} is not a JSON object.", "config.json unreadable")
    try:
        # trust_remote_code False: never the model's own code, and never a question on standard input.
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        if raw.get("auto_map"):
            raise _error(
                f"{label} needs its own Python code to load (config.json's auto_map), which artweb does not run; "
                "pick a model of an architecture that transformers itself supports.",
                "needs the model's own code",
            ) from None
        raise _error(
            f"transformers cannot read the config.json of {label}: {_reason(exc)}", "config.json unreadable"
        ) from None
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    architectures = list(config.architectures or [])
    named = next((a for a in architectures if a in causal), None)
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (architectures and named is None):
        what = f"the architecture {architectures[0]}" if architectures else f"the model type {config.model_type}"
        raise _error(
            f"The config.json of {label} names {what}, which is not a causal language model: artweb trains and serves "
            "text-generation models (a …ForCausalLM architecture).",
            "not a causal language model",
        )
    return named or MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]


def _check_tokenizer(directory: Path, label: str) -> None:
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise _error(
            f"The tokenizer of {label} cannot be loaded ({_reason(exc)}); the model needs its tokenizer files "
            "(tokenizer.json and tokenizer_config.json) beside config.json.",
            "no loadable tokenizer",
        ) from None


def _weights(directory: Path, label: str) -> tuple[tuple[str, ...], int]:
    """The weight files transformers would load, all present and (safetensors) whole; their total bytes."""
    for name in WEIGHT_FILES:
        path = directory / name
        # In the Hugging Face cache each file is a link to a blob: a link whose blob is gone still names it.
        if path.exists() or path.is_symlink():
            names = _index_shards(path, label) if name.endswith(".index.json") else [name]
            break
    else:
        raise _error(
            f"{label} has no weights: it needs model.safetensors (or the shards model.safetensors.index.json names) "
            "or pytorch_model.bin.",
            "no weights (.safetensors or .bin) found",
        )
    missing = [name for name in names if not (directory / name).is_file()]
    if missing:
        raise _error(
            f"{label} is missing {len(missing)} of its {len(names)} weight files ({', '.join(missing[:3])}"
            f"{', …' if len(missing) > 3 else ''}): download the model again.",
            "weights incomplete",
        )
    for name in names:
        if name.endswith(".safetensors"):
            _check_safetensors(directory / name, name, label)
    return tuple(names), sum((directory / name).stat().st_size for name in names)


def _index_shards(index: Path, label: str) -> list[str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise _error(
            f"The {index.name} of {label} is not a weight index (a JSON object with a weight_map): download the model again.",
            "weights incomplete",
        ) from None


def _check_safetensors(path: Path, name: str, label: str) -> None:
    """The file's header reads and its tensors end where the file does (a cut-off download does not)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as weights:
            weights.keys()
    except Exception as exc:
        raise _error(
            f"The weight file {name} of {label} is damaged or incomplete ({_reason(exc)}): download the model again.",
            "weights damaged",
        ) from None


def _check_size(size: int, *, label: str) -> None:
    """The weights against the workers' memory. No setting names that memory, so this machine's stands in
    for it (workers run beside the web server unless an operator spreads them out). On a CPU a worker holds
    the weights WEIGHT_COPIES times, in its inference server and in its trainer; on a GPU those copies are
    in the card's memory, and the machine's only has to load them."""
    import psutil

    memory = psutil.virtual_memory().total
    on_cpu = settings.ARTWEB["DEVICE"] == "cpu"
    copies = WEIGHT_COPIES if on_cpu else 1
    if size * copies <= memory:
        return
    held = (
        f"; a worker holds them {copies} times (in its inference server and in its trainer), "
        f"{size * copies / GIB:.1f} GiB,"
        if on_cpu
        else ","
    )
    raise _error(
        f"The weights of {label} are {size / GIB:.1f} GiB{held} and the workers have {memory / GIB:.1f} GiB of "
        "memory (this server's). Pick a smaller model.",
        "too large for the workers' memory",
    )


def _reason(exc: BaseException) -> str:
    """An exception's first line, without the server's paths, for a message."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = without_host_paths(text).rstrip(" :")
    return text if len(text) <= 300 else text[:299] + "…"


def _error(message: str, field: str) -> ApplicationError:
    message = message[0].upper() + message[1:]
    return ApplicationError(message, field_errors={"source": [field]})
