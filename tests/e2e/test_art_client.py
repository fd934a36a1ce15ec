"""ART's own client (openpipe-art from PyPI, unchanged) trains on a whole artweb: the ASGI server, a GPU
worker process that starts the vLLM CPU server with the default model and trains the LoRA, PostgreSQL
and Redis. The client runs tests/e2e/art_client/train_example.py, an ART script whose one artweb line is
its backend: `art.ServerlessBackend(api_key=<artweb API token>, base_url=<artweb>/api/v1/art)`.

The first test follows one model through two processes: register, rollouts through
model.openai_client(), two steps, delete_checkpoints(); another user's token finding none of it; the
same model registered again going on at step 3, a group of one trajectory refused, and a cancel on
artweb refusing the next train. The second runs ART 0.5.17's model.train().

One stack serves the module's tests (its vLLM server takes most of a minute to start on two cores); each
test's users, tokens and base model are its own (transactional_db: flushed after it).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from django.db import connection

from artweb.testing import stack
from artweb.testing.art_client import art_python
from training.client_runs.models import ClientModel, ClientTrainingJob
from training.engine.default_model import MODEL_NAME
from training.models import Checkpoint, Run, Step

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.worker, pytest.mark.timeout(900)]

SCRIPT = Path(__file__).resolve().parent / "art_client" / "train_example.py"


@dataclass
class ArtStack:
    url: str
    procs: list[stack.Proc]
    tmp: Path
    tokens: dict[str, str] = field(default_factory=dict)  # username -> API token, per test


@pytest.fixture(scope="module")
def art_stack(django_db_setup, tmp_path_factory):
    """The web server and a GPU worker on the test database, for all the module's tests."""
    tmp = tmp_path_factory.mktemp("art-client")
    env = stack.stack_env(
        db_name=connection.settings_dict["NAME"], data_dir=tmp / "data", ARTWEB_VLLM_PORT=str(stack.free_port())
    )
    procs: list[stack.Proc] = []
    try:
        procs.append(stack.start_web(env, tmp / "logs"))
        procs.append(stack.start_gpu_worker(env, tmp / "logs"))
        yield ArtStack(url=procs[0].extra["url"], procs=procs, tmp=tmp)
    finally:
        for proc in procs:
            proc.kill()


@pytest.fixture
def art(art_stack, transactional_db, django_user_model, vllm_model_dir):
    """The stack, with alice and bob and an API token each, and the default model registered under its
    artweb name, which the ART script gives as its base_model (all flushed after the test; the stack's
    processes stay, holding nothing of them)."""
    from rest_framework.authtoken.models import Token

    from training.services import base_model_register

    for name in ("alice", "bob"):
        user = django_user_model.objects.create_user(name, f"{name}@example.com", f"{name}-pass-123")
        art_stack.tokens[name] = Token.objects.create(user=user).key
    base_model_register(
        name=MODEL_NAME, source=str(vllm_model_dir), local_path=str(vllm_model_dir), supports_tools=True
    )
    return art_stack


class ArtScript:
    """train_example.py under ART's own interpreter, its JSON lines collected as they come."""

    def __init__(self, art: ArtStack, *, version: str = "0.5.18", user: str = "alice", **options: str):
        workdir = art.tmp / f"client-{options['ART_EXAMPLE_MODEL']}"
        workdir.mkdir(exist_ok=True)
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(workdir),
            "PYTHONUNBUFFERED": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of LiteLLM's price list at import
            "ARTWEB_API_TOKEN": art.tokens[user],
            "ARTWEB_ART_URL": f"{art.url}/api/v1/art",
            "ART_EXAMPLE_BASE_MODEL": MODEL_NAME,
            **options,
        }
        self.events: list[dict] = []
        self.stderr = workdir / "stderr.log"
        with self.stderr.open("ab") as stderr:
            self.popen = subprocess.Popen(
                [str(art_python(version)), str(SCRIPT)],
                cwd=workdir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def of(self, event: str) -> list[dict]:
        return [e for e in self.events if e["event"] == event]

    def wait(self, procs: list[stack.Proc], timeout: float = 600) -> int:
        stack.wait_for(lambda: self.popen.poll() is not None, timeout=timeout, procs=procs, what="the ART script")
        self._reader.join(timeout=10)
        return self.popen.returncode

    def log(self) -> str:
        return f"events: {self.events}\nstderr:\n{self.stderr.read_text(errors='replace')[-4000:]}"

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=30)


@pytest.fixture
def art_script(art):
    """Start train_example.py with these options (ART_EXAMPLE_*); whatever still runs is killed after the test."""
    started: list[ArtScript] = []

    def start(**options) -> ArtScript:
        started.append(ArtScript(art, **options))
        return started[-1]

    yield start
    for script in started:
        script.stop()


def _api(art: ArtStack, path: str, method: str = "GET", user: str = "alice") -> httpx.Response:
    return httpx.request(
        method, f"{art.url}/api/v1/{path}", headers={"Authorization": f"Token {art.tokens[user]}"}, timeout=30
    )


def _bobs_answers(art: ArtStack, run_id: int, job_id: int, inference_name: str) -> list[int]:
    """The statuses bob's token gets on alice's model, checkpoints, training job, inference name and run."""
    base, bob = f"{art.url}/api/v1/art", {"Authorization": f"Bearer {art.tokens['bob']}"}
    chat = {"model": inference_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answers = [
        httpx.get(f"{base}/preview/models/{run_id}", headers=bob),
        httpx.get(f"{base}/preview/models/{run_id}/checkpoints", headers=bob),
        httpx.request("DELETE", f"{base}/preview/models/{run_id}/checkpoints", headers=bob, json={"steps": [2]}),
        httpx.get(f"{base}/preview/training-jobs/{job_id}/events", headers=bob),
        httpx.post(f"{base}/chat/completions", headers=bob, json=chat, timeout=30),
        httpx.delete(f"{base}/preview/models/{run_id}", headers=bob),
        _api(art, f"runs/{run_id}/", user="bob"),
    ]
    return [a.status_code for a in answers]


def _trains(run: Run) -> list[int]:
    return list(Step.objects.filter(run=run).order_by("step").values_list("step", flat=True))


def _assert_two_steps_recorded(run: Run) -> list[ClientTrainingJob]:
    """What the first script's two train calls and its delete_checkpoints() left on artweb; the jobs."""
    run.refresh_from_db()
    assert (run.status, run.steps_done, run.num_steps) == (Run.Status.WAITING, 2, 2)
    assert _trains(run) == [1, 2]
    steps = {s.step: s for s in Step.objects.filter(run=run)}
    assert steps[1].metrics["client_turns_sampled"] == steps[2].metrics["client_turns_sampled"] == 6
    assert steps[1].metrics["client_turns_retokenized"] == 0 and steps[2].metrics["tokens_trained"] > 0
    jobs = list(ClientTrainingJob.objects.filter(run=run).order_by("id"))
    assert [(j.status, j.step) for j in jobs] == [("done", 1), ("done", 2)]
    assert [e.type for e in jobs[0].events.order_by("id")] == ["training_started", "gradient_step", "training_ended"]
    for traj in run.trajectories.filter(group__step=1):
        [turn] = [m for m in traj.messages if m["role"] == "assistant"]
        assert len(turn["token_ids"]) == len(turn["logprobs"]) > 0
    # delete_checkpoints() kept the latest: step 1's files are gone, its row marked deleted.
    ckpts = {c.step: c for c in Checkpoint.objects.filter(run=run)}
    assert ckpts[1].state == Checkpoint.State.DELETED and not Path(ckpts[1].path).exists()
    assert ckpts[2].state == Checkpoint.State.ACTIVE
    assert (Path(ckpts[2].path) / "adapter_model.safetensors").exists()
    return jobs


def test_an_art_script_registers_trains_resumes_and_stops_when_the_run_is_cancelled(art, art_script):
    first = art_script(ART_EXAMPLE_MODEL="lengthy", ART_EXAMPLE_STEPS="2", ART_EXAMPLE_DELETE="1")
    assert first.wait(art.procs) == 0, first.log()

    [registered] = first.of("registered")
    found = ClientModel.objects.select_related("run").get(owner__username="alice", name="lengthy")
    run = found.run
    assert registered["id"] == str(run.id) and registered["entity"] == "alice"
    assert registered["inference_name"] == "wandb-artifact:///alice/artweb-e2e/lengthy"
    assert run.driver == Run.Driver.CLIENT and run.base_model.name == MODEL_NAME
    # Rollouts through model.openai_client(): each choice came back with its log-probs, and the trainer got
    # the sampler's token ids with them (no turn retokenised).
    rollouts = first.of("rollouts")
    assert [(r["groups"], r["trajectories"], r["with_logprobs"]) for r in rollouts] == [(2, 6, 6)] * 2, first.log()
    assert [t["step"] for t in first.of("trained")] == [1, 2]
    assert [s["step"] for s in first.of("step")] == [0, 2]
    assert first.of("deleted") == [{"event": "deleted", "step": 2}]

    jobs = _assert_two_steps_recorded(run)
    # The run's API shows the same.
    detail = _api(art, f"runs/{run.id}/").json()
    assert (detail["status"], detail["steps_done"]) == ("waiting", 2)
    listed = _api(art, f"runs/{run.id}/checkpoints/").json()["results"]
    assert {(c["step"], c["state"]) for c in listed} == {(1, "deleted"), (2, "active")}
    # bob's token finds none of it: the same 404 as for what does not exist, and his DELETE changed nothing.
    assert _bobs_answers(art, run.id, jobs[1].id, registered["inference_name"]) == [404] * 7
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING
    assert Checkpoint.objects.get(run=run, step=2).state == Checkpoint.State.ACTIVE

    # A second process registers the same model: the same run, which goes on from step 2. A group of one
    # trajectory is refused first, naming the group; then the run is cancelled on artweb while the script
    # holds its next batch, and that train raises saying so.
    hold = art.tmp / "lengthy-go"
    second = art_script(
        ART_EXAMPLE_MODEL="lengthy", ART_EXAMPLE_STEPS="2", ART_EXAMPLE_BAD_GROUP="1", ART_EXAMPLE_HOLD=str(hold)
    )
    stack.wait_for(
        lambda: second.of("holding") or second.popen.poll() is not None,
        timeout=600,
        procs=art.procs,
        what="the second script to hold before its last train",
    )
    assert second.of("holding"), second.log()
    assert [second.of("registered")[0]["id"], second.of("step")[0]["step"]] == [str(run.id), 2]
    [refused] = second.of("refused")
    assert refused["type"] == "BadRequestError" and "group 1 has 1 trajectories" in refused["message"], refused
    assert "at least two" in refused["message"]
    assert [t["step"] for t in second.of("trained")] == [3]
    cancelled = _api(art, f"runs/{run.id}/cancel/", method="POST")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
    hold.touch()
    assert second.wait(art.procs) == 1, second.log()
    [raised] = second.of("raised")
    assert raised["type"] == "ConflictError" and "was cancelled on artweb" in raised["message"], raised
    assert f"#{run.id}" in raised["message"]

    run.refresh_from_db()
    assert (run.status, run.steps_done) == (Run.Status.CANCELLED, 3)
    assert _trains(run) == [1, 2, 3]
    # Neither the refused group nor the train after the cancel left a job behind.
    assert list(ClientTrainingJob.objects.filter(run=run).values_list("step", flat=True)) == [1, 2, 3]
    assert ClientModel.objects.filter(owner__username="alice").count() == 1


def test_an_art_0_5_17_script_trains_with_model_train(art, art_script):
    """ART 0.5.17's `model.train(groups, config=art.TrainConfig(...))`, deprecated since but still written."""
    script = art_script(version="0.5.17", ART_EXAMPLE_MODEL="older", ART_EXAMPLE_STEPS="1", ART_EXAMPLE_API="model")
    assert script.wait(art.procs) == 0, script.log()
    run = ClientModel.objects.select_related("run").get(owner__username="alice", name="older").run
    assert script.of("registered")[0]["id"] == str(run.id)
    assert script.of("trained") == [{"event": "trained", "step": 1}]
    run.refresh_from_db()
    assert (run.status, run.steps_done) == (Run.Status.WAITING, 1)
    assert _trains(run) == [1]
    assert Step.objects.get(run=run, step=1).metrics["client_turns_sampled"] == 6
    assert ClientTrainingJob.objects.get(run=run).status == ClientTrainingJob.Status.DONE
