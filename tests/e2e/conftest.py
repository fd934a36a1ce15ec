import json
import threading
from pathlib import Path

import pytest
from django.db import connection

from artweb.testing import stack
from tests.e2e.serving import served_run, serving_worker, web  # noqa: F401 - the serving tests' fixtures

EXAMPLES = Path(__file__).resolve().parents[2] / "rollouts" / "examples"


@pytest.fixture
def stack_env(request, transactional_db, tmp_path, vllm_model_dir):
    """Environment for worker/web processes: the test database, a fresh data dir, a free inference port and
    the inference server: vLLM, or the one a test names with `@pytest.mark.inference_engine(name)`."""
    marker = request.node.get_closest_marker("inference_engine")
    return stack.stack_env(
        db_name=connection.settings_dict["NAME"],
        data_dir=tmp_path / "data",
        ARTWEB_VLLM_PORT=str(stack.free_port()),
        ARTWEB_INFERENCE_ENGINE=marker.args[0] if marker else "vllm",
    )


@pytest.fixture
def procs(tmp_path):
    started: list[stack.Proc] = []
    yield started
    for p in started:
        p.kill()


@pytest.fixture
def example_run_inputs(transactional_db, django_user_model, vllm_model_dir):
    """alice, the default model registered, and the shipped example task uploaded through the services."""
    from rollouts.services import reward_create, scenario_set_create, script_create
    from training.services import base_model_register

    alice = django_user_model.objects.create_user("alice", "alice@example.com", "alice-pass-123")
    model = base_model_register(
        name="SmolLM2-135M-Instruct", source=str(vllm_model_dir), local_path=str(vllm_model_dir), supports_tools=True
    )
    script = script_create(owner=alice, name="example", content=(EXAMPLES / "rollout.py").read_text())
    reward = reward_create(owner=alice, name="example", content=(EXAMPLES / "reward.py").read_text())
    scenarios = scenario_set_create(owner=alice, name="example", jsonl=(EXAMPLES / "scenarios.jsonl").read_text())
    return {
        "owner": alice,
        "base_model": model,
        "script_version": script,
        "reward_version": reward,
        "scenario_set": scenarios,
    }


class SocketRecorder:
    """A real WebSocket client (session cookie auth) collecting a run's messages in a thread."""

    def __init__(self, url: str, cookie: str, origin: str):
        from websockets.sync.client import connect

        self.messages: list[dict] = []
        self.ws = connect(url, additional_headers={"Cookie": cookie, "Origin": origin}, open_timeout=10)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        try:
            for raw in self.ws:
                self.messages.append(json.loads(raw))
        except Exception:
            pass

    def of_type(self, kind: str) -> list[dict]:
        return [m for m in self.messages if m.get("type") == kind]

    def close(self):
        self.ws.close()


@pytest.fixture
def socket_for(client):
    opened = []

    def open_socket(web_url: str, run_id: int, user) -> SocketRecorder:
        client.force_login(user)
        cookie = f"sessionid={client.cookies['sessionid'].value}"
        rec = SocketRecorder(web_url.replace("http", "ws") + f"/ws/runs/{run_id}/", cookie, web_url)
        opened.append(rec)
        return rec

    yield open_socket
    for rec in opened:
        rec.close()
