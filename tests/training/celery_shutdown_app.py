"""A Celery app for tests/training/test_inference_cleanup.py: artweb's own app, with its signal handlers,
whose pool child starts a stand-in inference server at once, as a GPU worker's child does for its first
step (the stand-in is a sleeping process: no vLLM here), with a merged copy in its work directory. The
test then stops the worker as an operator or the launcher does, with SIGTERM."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from celery.signals import worker_process_init

from artweb.celery import app  # noqa: F401  (the app `celery -A` finds here, signal handlers included)


@worker_process_init.connect
def _start_stand_in_server(**kwargs) -> None:
    from rollouts.inference.inference_server import InferenceServer
    from training.services import inference

    class StandIn(InferenceServer):
        def command(self) -> list[str]:
            return [sys.executable, "-c", "import time; time.sleep(600)"]

        def environment(self) -> dict[str, str]:
            return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    server = StandIn("/nonexistent/model")
    server.start(wait=False)
    copy = server.work_dir / "merged" / "run-1@1"
    copy.mkdir(parents=True)
    (copy / "model.safetensors").write_bytes(b"\0" * (1 << 20))
    inference._server = server
    Path(os.environ["ARTWEB_TEST_STARTED"]).write_text(
        json.dumps({"work_dir": str(server.work_dir), "server": server._proc.pid, "child": os.getpid()})
    )
