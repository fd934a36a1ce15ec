"""The OpenAI-compatible endpoint answers while a run step holds the worker's inference server: a real GPU
worker process (Celery, the product's command line) with the CPU build of vLLM and the default model, the
ASGI app, PostgreSQL and Redis. Each rollout of the run's script sleeps (SLEEP_S) beside its one model call,
which holds the step in its rollouts while requests are sent.

- merged mode (the CPU default): requests go to a second server of the worker's own, started on the first
  request, so they are answered during the step, with their first token quickly;
- "lora" mode (ARTWEB_VLLM_ADAPTER_MODE=lora): requests share the step's server, and the served adapters
  and the step's live side by side: the step's rollouts use its adapter after the endpoint loaded its own,
  and the step's retirement of old adapters leaves the endpoint's;
- merged mode without memory for a second server (ARTWEB_SERVE_SERVER_GB): refused with a log line, and a
  request waits for the step, as every request did before.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
import redis
from django.conf import settings
from django.core.cache import cache

from artweb.testing import stack
from artweb.testing.serving import make_served_run
from training.models import Checkpoint, Run, Step
from training.services.checkpoints import checkpoint_delete
from training.serving.protocol import ALIVE_KEY

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(1800)]

SLEEP_S = 45  # each rollout's sleep: the step is in its rollouts at least this long
FIRST_TOKEN_S = 10.0  # a warm request's first token during a step (2.5 s at most in bench/results/serve_during_step.md)
SCRIPT = """
import asyncio

import art


async def rollout(model: art.Model, scenario) -> art.Trajectory:
    messages = [{"role": "user", "content": scenario.prompt}]
    if scenario.sleep_first:
        await asyncio.sleep(scenario.sleep)
    completion = await model.openai_client().chat.completions.create(
        model=model.name, messages=messages, max_tokens=8
    )
    if not scenario.sleep_first:
        await asyncio.sleep(scenario.sleep)
    trajectory = art.Trajectory(messages_and_choices=messages)
    trajectory.messages_and_choices.append(completion.choices[0])
    return trajectory
"""
REWARD = """
def reward(trajectory, scenario) -> float:
    return min(1.0, len(trajectory.messages()[-1]["content"] or "") / 40)
"""
CONFIG = {
    "group_size": 2,
    "scenarios_per_step": 1,
    "max_tokens": 8,
    "val_every": 0,
    "rollout_timeout_s": 600,
    "keep_last_checkpoints": 5,
}


@pytest.fixture
def inputs(transactional_db, django_user_model, vllm_model_dir, tmp_path):
    """alice with a token, the default model with a finished run's checkpoint (the served checkpoint), and
    the sleeping task."""
    from rest_framework.authtoken.models import Token

    from rollouts.services import reward_create, scenario_set_create, script_create

    alice = django_user_model.objects.create_user("alice", "alice@example.com", "alice-pass-123")
    model, other_run, checkpoint = make_served_run(alice, vllm_model_dir, tmp_path / "served")

    def task(*, sleep_first: bool) -> dict:
        scenario = {"prompt": "Name a colour.", "sleep": SLEEP_S, "sleep_first": sleep_first, "split": "train"}
        return {
            "owner": alice,
            "base_model": model,
            "script_version": script_create(owner=alice, name="sleepy", content=SCRIPT),
            "reward_version": reward_create(owner=alice, name="length", content=REWARD),
            "scenario_set": scenario_set_create(owner=alice, name="one", jsonl=json.dumps(scenario) + "\n"),
        }

    return {
        "model": model,
        "checkpoint_name": f"run-{other_run.id}@{checkpoint.step}",
        "checkpoint": checkpoint,
        "token": Token.objects.create(user=alice).key,
        "task": task,
    }


class Endpoint:
    def __init__(self, url: str, token: str):
        self.url = f"{url}/api/v1/openai/chat/completions"
        self.http = httpx.Client(timeout=httpx.Timeout(900.0, connect=10.0))
        self.headers = {"Authorization": f"Bearer {token}"}

    def stream(self, model: str, max_tokens: int = 8) -> dict:
        """A streamed chat completion: {"first": seconds to its first text, "done_at": time.time() at its end}."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        t0, first, text = time.perf_counter(), None, ""
        with self.http.stream("POST", self.url, json=body, headers=self.headers) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content"):
                    first = first if first is not None else time.perf_counter() - t0
                    text += delta["content"]
        assert text, "no text streamed"
        return {"first": first, "done_at": time.time(), "text": text}


def _start(stack_env, procs, tmp_path, **env) -> tuple[stack.Proc, stack.Proc]:
    """The web server and a GPU worker whose serving thread runs (it says so in Redis)."""
    env = {**stack_env, **env}
    conn = redis.Redis.from_url(settings.REDIS_URL)
    conn.delete(ALIVE_KEY)  # an earlier test's worker's
    web = stack.start_web(env, tmp_path / "logs")
    procs.append(web)
    worker = stack.start_gpu_worker(env, tmp_path / "logs")
    procs.append(worker)
    stack.wait_for(lambda: conn.exists(ALIVE_KEY), timeout=300, procs=procs, what="the serving thread")
    return web, worker


def _wait_status(run: Run, status: str, procs, *, timeout: float = 900) -> None:
    stack.wait_for(
        lambda: Run.objects.get(id=run.id).status in (status, *Run.FINAL_STATUSES),
        timeout=timeout,
        interval=0.5,
        procs=procs,
        what=f"the run to be {status}",
    )
    assert Run.objects.get(id=run.id).status == status, Run.objects.get(id=run.id).error


def _step_recorded_at(run: Run, step: int, procs) -> float:
    stack.wait_for(
        lambda: Step.objects.filter(run=run, step=step).exists(),
        timeout=900,
        interval=0.5,
        procs=procs,
        what=f"step {step}",
    )
    return Step.objects.get(run=run, step=step).created_at.timestamp()


def test_a_merged_mode_worker_answers_during_a_step_on_a_server_of_its_own(inputs, stack_env, procs, tmp_path):
    from training.services import run_create

    web, worker = _start(stack_env, procs, tmp_path)
    endpoint = Endpoint(web.extra["url"], inputs["token"])
    base = inputs["model"].name
    endpoint.stream(base)  # starts the worker's serving server (a minute or so)

    run = run_create(name="busy", config={**CONFIG, "num_steps": 1}, **inputs["task"](sleep_first=False))
    _wait_status(run, Run.Status.RUNNING, procs)
    time.sleep(5)  # into the rollouts, which sleep SLEEP_S
    assert not Step.objects.filter(run=run).exists()
    warm = endpoint.stream(base)
    checkpoint = endpoint.stream(inputs["checkpoint_name"])  # merged into the serving server on first use
    again = endpoint.stream(base)

    ended_at = _step_recorded_at(run, 1, procs)
    assert warm["done_at"] < ended_at and checkpoint["done_at"] < ended_at and again["done_at"] < ended_at
    assert warm["first"] < FIRST_TOKEN_S and again["first"] < FIRST_TOKEN_S, (warm, again)
    _wait_status(run, Run.Status.COMPLETED, procs)
    assert "no inference server of its own" not in worker.log.read_text(errors="replace")


def test_in_lora_mode_the_steps_adapter_and_the_served_adapters_live_side_by_side(inputs, stack_env, procs, tmp_path):
    from training.services import run_create

    web, worker = _start(stack_env, procs, tmp_path, ARTWEB_VLLM_ADAPTER_MODE="lora")
    endpoint = Endpoint(web.extra["url"], inputs["token"])
    # Each rollout sleeps before its model call: step 2's rollouts call the step's adapter (run-<id>@1) after
    # the endpoint loaded its own copy of that checkpoint, and another checkpoint beside it.
    run = run_create(name="busy", config={**CONFIG, "num_steps": 2}, **inputs["task"](sleep_first=True))
    _step_recorded_at(run, 1, procs)
    time.sleep(5)  # step 2 is in its rollouts
    assert not Step.objects.filter(run=run, step=2).exists()
    own = endpoint.stream(f"run-{run.id}@1")
    other = endpoint.stream(inputs["checkpoint_name"])
    base = endpoint.stream(inputs["model"].name)

    ended_at = _step_recorded_at(run, 2, procs)
    assert own["done_at"] < ended_at and other["done_at"] < ended_at and base["done_at"] < ended_at
    assert base["first"] < FIRST_TOKEN_S, base
    _wait_status(run, Run.Status.COMPLETED, procs)
    step2 = Step.objects.get(run=run, step=2)
    assert step2.metrics["rollout_errors"] == 0, step2.metrics  # the step's adapter was there for them
    # Step 2 retired its old adapter (run-<id>@1) and left the endpoint's, which are answered with at once
    # still; they hold no checkpoint: step 1's is deleted as ART's delete_checkpoints would.
    again = endpoint.stream(inputs["checkpoint_name"])
    assert again["first"] < FIRST_TOKEN_S, again
    step1 = run.checkpoints.get(step=1)
    assert step1.path not in set(cache.get("artweb:loaded_adapters") or [])
    checkpoint_delete(checkpoint=step1)
    assert run.checkpoints.get(step=1).state == Checkpoint.State.DELETED
    assert "no inference server of its own" not in worker.log.read_text(errors="replace")


def test_without_memory_for_a_second_server_requests_wait_for_the_step(inputs, stack_env, procs, tmp_path):
    from training.services import run_create

    web, worker = _start(stack_env, procs, tmp_path, ARTWEB_SERVE_SERVER_GB="100000")
    endpoint = Endpoint(web.extra["url"], inputs["token"])
    run = run_create(name="busy", config={**CONFIG, "num_steps": 1}, **inputs["task"](sleep_first=False))
    _wait_status(run, Run.Status.RUNNING, procs)
    time.sleep(5)
    answer = endpoint.stream(inputs["model"].name)
    ended_at = _step_recorded_at(run, 1, procs)
    assert answer["done_at"] > ended_at  # it waited for the step
    log = worker.log.read_text(errors="replace")
    assert "no inference server of its own for the OpenAI endpoint: it would take about 100000.0 GiB" in log
