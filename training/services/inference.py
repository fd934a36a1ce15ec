"""The worker's inference server and trainer: one of each per GPU worker process, reused across steps.

A GPU worker runs one run step at a time (concurrency 1), so plain module state is enough here. The
vLLM server is started for a base model on first use, restarted if it died, and stopped with the
worker. The trainer stays loaded between steps of the same run; a different run, or a step that is not
the one the trainer is at (a retry, another worker's progress), reloads it from the checkpoint.
"""

from __future__ import annotations

import atexit
import logging
import threading
from pathlib import Path

from django.conf import settings
from django.core.cache import cache

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_server = None  # rollouts.runtime.vllm_server.VLLMServer
_server_model: str | None = None
_trainer = None
_trainer_key: tuple[int, int] | None = None  # (run id, step the trainer is at)


def base_model_path(base_model) -> str:
    return base_model.local_path or base_model.source


def jail_config():
    """The sandbox settings as the runtime takes them."""
    from rollouts.runtime.jail import JailConfig

    conf = settings.ARTWEB
    return JailConfig(mode=conf["SANDBOX"], uid=conf["SANDBOX_UID"], cgroup_parent=conf["SANDBOX_CGROUP"])


def vocab_size(base_model) -> int | None:
    """Rows of the model's embedding: every token id a sandbox reports must be below it."""
    import json

    try:
        config = json.loads((Path(base_model_path(base_model)) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if isinstance(size, int) else None


def inference_server(base_model):
    """A healthy vLLM server for this base model (started or restarted as needed)."""
    global _server, _server_model
    from rollouts.runtime.vllm_server import VLLMServer

    path = base_model_path(base_model)
    with _lock:
        if _server is not None and _server_model != path:
            _server.stop()
            _server = None
        if _server is None:
            conf = settings.ARTWEB
            _server = VLLMServer(
                model_path=path,
                python=conf["VLLM_PYTHON"] or None,
                port=conf["VLLM_PORT"],
                max_model_len=base_model.max_length,
                extra_args=conf["VLLM_EXTRA_ARGS"].split() if conf["VLLM_EXTRA_ARGS"] else [],
                enforce_eager=conf["VLLM_ENFORCE_EAGER"],
                kv_cache_gb=conf["VLLM_KV_CACHE_GB"],
                adapter_mode=conf["VLLM_ADAPTER_MODE"],
                log_dir=str(Path(settings.DATA_DIR) / "logs"),
            )
            _server_model = path
            _server.start()
        _server.ensure_running()
        return _server


def adapters_loaded_publish() -> None:
    """Tell the web side which adapter directories are loaded (checkpoint deletion refuses those)."""
    paths = list(_server.loaded_adapter_paths()) if _server is not None else []
    cache.set("artweb:loaded_adapters", paths, timeout=None)


def trainer_for(run, *, checkpoint_dir: str | None):
    """The trainer for this run at run.steps_done, loading or resuming as needed."""
    global _trainer, _trainer_key
    from training.engine import TrainConfig, make_trainer

    key = (run.id, run.steps_done)
    if _trainer is not None and _trainer_key == key:
        return _trainer
    trainer_close()
    # The backend belongs to the worker's hardware (unsloth on GPU hosts, peft on CPU), not to the run.
    cfg = TrainConfig.from_dict({**run.config.get("train", {}), "backend": settings.ARTWEB["TRAINER_BACKEND"]})
    trainer = make_trainer(cfg, base_model_path=base_model_path(run.base_model), device=settings.ARTWEB["DEVICE"])
    trainer.load(checkpoint_dir)
    _trainer, _trainer_key = trainer, key
    return trainer


def trainer_advanced(run_id: int, step: int) -> None:
    global _trainer_key
    _trainer_key = (run_id, step)


def trainer_close() -> None:
    global _trainer, _trainer_key
    if _trainer is not None:
        try:
            _trainer.close()
        except Exception:  # noqa: BLE001 - freeing memory must not fail the caller
            logger.warning("trainer close failed", exc_info=True)
    _trainer, _trainer_key = None, None


def shutdown() -> None:
    global _server
    trainer_close()
    if _server is not None:
        _server.stop()
        _server = None


atexit.register(shutdown)


def dry_run_execute(*, dry_run_id: int) -> None:
    """Run a dry run against the base model on this worker's inference server."""
    from django.utils import timezone

    from rollouts.models import DryRun
    from rollouts.runtime.sandbox import dry_run

    if DryRun.objects.filter(id=dry_run_id, status=DryRun.Status.QUEUED).update(status=DryRun.Status.RUNNING) != 1:
        return
    obj = DryRun.objects.select_related("script_version", "reward_version", "base_model").get(id=dry_run_id)
    try:
        server = inference_server(obj.base_model)
        result = dry_run(
            script=obj.script_version.content,
            reward=obj.reward_version.content if obj.reward_version else None,
            scenarios=obj.scenarios, base_url=server.base_url, model_name=server.ensure_base(),
            api_key=server.api_key, jail=jail_config(), vocab_size=vocab_size(obj.base_model),
        )
        DryRun.objects.filter(id=dry_run_id).update(status=DryRun.Status.DONE, result=result,
                                                    finished_at=timezone.now())
    except Exception as exc:  # noqa: BLE001 - the person sees the failure on the dry-run page
        logger.exception("dry run %s failed", dry_run_id)
        DryRun.objects.filter(id=dry_run_id).update(status=DryRun.Status.FAILED, error=f"{type(exc).__name__}: {exc}",
                                                    finished_at=timezone.now())
