"""The `artweb` command line against a live ASGI server (uvicorn subprocess) on the test database.

The first test drives everything but the training itself: the test writes the steps, trajectories and
checkpoint a GPU worker would write, while `runs watch` polls. The second is the whole thing: a Celery
GPU worker with a vLLM CPU server trains the shipped example task, driven only by the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.db import connection

from artweb.testing import stack
from artweb.testing.model_cache import DEFAULT_REPO_ID

EXAMPLES = Path(__file__).resolve().parents[2] / "rollouts" / "examples"
PASSWORD = "alice-cli-pass-123"


def broker_url() -> str:
    """A Redis database of its own for Celery messages, so runs queued here never reach the workers
    of other test sessions on the same Redis (and theirs never reach ours)."""
    from django.conf import settings

    default = urlparse(settings.REDIS_URL)._replace(path="/14").geturl()
    return os.environ.get("ARTWEB_TEST_BROKER_URL", default)


def purge_queues(url: str) -> None:
    from artweb.celery import app

    with app.connection_for_write(url) as conn:
        for queue in ("gpu", "default"):
            try:
                conn.default_channel.queue_purge(queue)
            except Exception:
                pass


@pytest.fixture
def server_env(transactional_db, tmp_path):
    url = broker_url()
    purge_queues(url)
    env = stack.stack_env(
        db_name=connection.settings_dict["NAME"],
        data_dir=tmp_path / "data",
        CELERY_BROKER_URL=url,
        ARTWEB_VLLM_PORT=str(stack.free_port()),
    )
    yield env
    purge_queues(url)


@pytest.fixture
def server(server_env, tmp_path):
    web = stack.start_web(server_env, tmp_path / "logs")
    yield web
    web.kill()


@pytest.fixture
def alice_login(transactional_db, django_user_model):
    return django_user_model.objects.create_user("alice", "alice@example.com", PASSWORD)


class Cli:
    def __init__(self, url: str):
        self.url = url
        self.token: str | None = None

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARTWEB_")}
        env.update(ARTWEB_URL=self.url, COLUMNS="200", PYTHONUNBUFFERED="1")
        if self.token:
            env["ARTWEB_TOKEN"] = self.token
        return env

    def __call__(self, *args: str, ok: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "artweb.cli", *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=stack.REPO,
            check=False,
        )
        if ok:
            assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "artweb.cli", *args],
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=stack.REPO,
        )


def login_and_upload(cli: Cli) -> None:
    """token create (password) → token; upload the example task's three files."""
    result = cli("token", "create", "--username", "alice", "--password", PASSWORD)
    cli.token = result.stdout.strip()
    assert len(cli.token) == 40
    assert "valid" in cli("validate", "script", str(EXAMPLES / "rollout.py")).stdout
    assert "version 1" in cli("upload", "script", str(EXAMPLES / "rollout.py"), "--name", "example").stdout
    assert "(trajectory)" in cli("upload", "reward", str(EXAMPLES / "reward.py"), "--name", "example").stdout
    out = cli("upload", "scenarios", str(EXAMPLES / "scenarios.jsonl"), "--name", "example").stdout
    assert "scenario set" in out and "train" in out


def write_run_file(path: Path, *, model: str, **config) -> Path:
    path.write_text(
        json.dumps(
            {
                "name": "cli-run",
                "model": model,
                "script": "example",
                "reward": "example",
                "scenarios": "example",
                "tags": ["cli"],
                **config,
            }
        )
    )
    return path


@pytest.mark.slow
def test_the_cli_drives_a_run_against_a_live_server(hub_model, server, alice_login, tmp_path):
    from training.models import Checkpoint, Run, Step, Trajectory, TrajectoryGroup

    # The model registered below is looked up in the server's Hugging Face cache: the test's, which the
    # server's environment names because hub_model is set up before server.
    hub_model(DEFAULT_REPO_ID)
    cli = Cli(server.extra["url"])
    login_and_upload(cli)
    # A second upload under the same name is a new version of that script.
    changed = tmp_path / "rollout.py"
    changed.write_text((EXAMPLES / "rollout.py").read_text() + "\n# tweaked\n")
    assert "version 2" in cli("upload", "script", str(changed), "--name", "example").stdout
    assert "smol" in cli("models", "register", "smol", DEFAULT_REPO_ID).stdout
    assert "smol" in cli("models", "list").stdout

    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text(
        "name: from-yaml\nbase_model: smol\nscript: example\nscript_version: 1\nreward: example\n"
        "scenario_set: example\nconfig:\n  num_steps: 3\n  group_size: 2\n"
    )
    started = cli("runs", "start", "--config", str(yaml_file)).stdout
    run = Run.objects.get(name="from-yaml")
    assert f"run {run.id} 'from-yaml' queued (3 steps)" in started
    assert run.script_version.number == 1 and run.config["group_size"] == 2 and run.owner == alice_login

    bad = write_run_file(tmp_path / "bad.json", model="smol", num_steps=0)
    result = cli("runs", "start", "--config", str(bad), ok=False)
    assert result.returncode == 1 and "num_steps" in result.stderr and "Error (400)" in result.stderr
    assert Run.objects.count() == 1

    listed = cli("runs", "list").stdout
    assert "from-yaml" in listed and "queued" in listed
    shown = json.loads(cli("runs", "show", str(run.id), "--json").stdout)
    assert shown["id"] == run.id and shown["script"]["version"] == 1
    assert shown["queue"]["place"] == 1  # queued, the only run: next in the fair queue
    assert f"#1: {shown['queue']['reason']}" in cli("runs", "show", str(run.id)).stdout
    missing = cli("runs", "show", "987654", ok=False)
    assert missing.returncode == 1 and "Error (404)" in missing.stderr

    # What a GPU worker would write: two steps now, the third (and completion) while `watch` polls.
    scenario = run.scenario_set.scenarios.first()
    for step in (1, 2):
        Step.objects.create(run=run, step=step, reward_mean=0.25 * step, metrics={"loss": 1.0 / step})
    Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING, steps_done=2)
    watch = cli.popen("runs", "watch", str(run.id), "--interval", "0.5", "--timeout", "120")
    time.sleep(2)
    group = TrajectoryGroup.objects.create(run=run, step=3, scenario=scenario, reward_mean=0.75)
    Trajectory.objects.bulk_create(
        [
            Trajectory(
                group=group,
                run=run,
                step=3,
                index=i,
                reward=i / 2,
                search_text=f"answer {i}",
                messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": f"answer {i}"}],
            )
            for i in range(2)
        ]
    )
    Step.objects.create(run=run, step=3, reward_mean=0.75, metrics={"loss": 0.3})
    adapter = tmp_path / "ckpt" / "step-3"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 2048)
    checkpoint = Checkpoint.objects.create(run=run, step=3, path=str(adapter), size_bytes=2056)
    Run.objects.filter(id=run.id).update(status=Run.Status.COMPLETED, steps_done=3)
    out, err = watch.communicate(timeout=120)
    assert watch.returncode == 0, (out, err)
    assert f"run {run.id} completed: 3/3 steps, reward_mean 0.75 at step 3" in out

    export = tmp_path / "run.jsonl"
    assert "2 trajectories" in cli("runs", "export", str(run.id), "--out", str(export)).stdout
    rows = [json.loads(line) for line in export.read_text().splitlines()]
    assert [r["messages"][-1]["content"] for r in rows] == ["answer 0", "answer 1"]
    cli("runs", "export", str(run.id), "--out", str(export), "--min-reward", "0.4")
    assert len(export.read_text().splitlines()) == 1

    assert "step-3" not in cli("checkpoints", "list", str(run.id)).stdout  # rows, not paths
    archive = tmp_path / "adapter.tar.gz"
    cli("checkpoints", "download", str(checkpoint.id), "--out", str(archive))
    with tarfile.open(archive) as tar:
        top = f"run{run.id}-step3"
        assert sorted(tar.getnames()) == [f"{top}/adapter_config.json", f"{top}/adapter_model.safetensors"]
    assert "promoted" in cli("checkpoints", "promote", str(checkpoint.id)).stdout

    second = write_run_file(tmp_path / "second.json", model="smol", num_steps=2)
    cli("runs", "start", "--config", str(second), "--name", "to-cancel")
    to_cancel = Run.objects.get(name="to-cancel")
    assert f"run {to_cancel.id} cancelled" in cli("runs", "cancel", str(to_cancel.id)).stdout
    assert "Cancelled before it ran" in cli("runs", "events", str(to_cancel.id)).stdout

    assert "revoked" in cli("token", "revoke").stdout
    denied = cli("runs", "list", ok=False)
    assert denied.returncode == 1 and "Error (401)" in denied.stderr


def test_the_cli_reports_an_unreachable_server(tmp_path):
    cli = Cli(f"http://127.0.0.1:{stack.free_port()}")
    cli.token = "x" * 40
    result = cli("runs", "list", ok=False)
    assert result.returncode == 2 and "Cannot reach the server" in result.stderr
    no_token = Cli("http://127.0.0.1:1")("runs", "list", ok=False)
    assert no_token.returncode == 2 and "ARTWEB_TOKEN" in no_token.stderr


SMALL = {
    "num_steps": 2,
    "group_size": 4,
    "scenarios_per_step": 2,
    "max_tokens": 24,
    "val_every": 2,
    "val_scenarios": 2,
    "train": {"learning_rate": 5e-5},
}


@pytest.mark.vllm
@pytest.mark.worker
@pytest.mark.e2e
@pytest.mark.timeout(3600)
def test_the_cli_trains_the_example_task_end_to_end(server_env, alice_login, vllm_model_dir, tmp_path):
    """A real GPU-queue Celery worker (vLLM CPU server, PEFT trainer) runs what the CLI queued."""
    from training.models import Run
    from training.services import base_model_register

    # Registering a server directory is an operator's job (staff only over the API), done here directly.
    base_model_register(
        name="SmolLM2-135M-Instruct", source=str(vllm_model_dir), local_path=str(vllm_model_dir), supports_tools=True
    )
    web = stack.start_web(server_env, tmp_path / "logs")
    worker = stack.start_gpu_worker(server_env, tmp_path / "logs")
    try:
        cli = Cli(web.extra["url"])
        login_and_upload(cli)
        run_file = write_run_file(tmp_path / "run.json", model="SmolLM2-135M-Instruct", **SMALL)
        # The first step starts the vLLM server: minutes on two busy cores, so the limits are generous.
        result = cli("runs", "start", "--config", str(run_file), "--watch", timeout=3000)
        run = Run.objects.get(name="cli-run")
        assert result.returncode == 0 and run.status == Run.Status.COMPLETED, (result.stdout, worker.tail())
        assert f"run {run.id} completed: 2/2 steps" in result.stdout

        export = tmp_path / "run.jsonl"
        cli("runs", "export", str(run.id), "--out", str(export), "--split", "train")
        rows = [json.loads(line) for line in export.read_text().splitlines()]
        assert len(rows) == 2 * 2 * 4 and all(r["messages"] for r in rows)

        newest = run.checkpoints.filter(state="active").order_by("-step").first()
        archive = tmp_path / "adapter.tar.gz"
        cli("checkpoints", "download", str(newest.id), "--out", str(archive))
        with tarfile.open(archive) as tar:
            assert any(name.endswith("adapter_model.safetensors") for name in tar.getnames())
    finally:
        worker.kill()
        web.kill()
