"""Fixtures for export tests: a run with two committed steps, and a local HTTP endpoint that records
(allowed through the egress guard as an operator would allow a private server: tests/egress.py)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from artweb.testing.factories import RunFactory, StepFactory, TrajectoryFactory, TrajectoryGroupFactory
from rollouts.models import Scenario
from tests.egress import egress_allow

TOOL_MESSAGES = [
    {"role": "system", "content": "You answer with one word."},
    {"role": "user", "content": "What is the capital of France?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "France"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Paris"},
    {"role": "assistant", "content": "Paris"},
]


def _group(run, step, split, scenario, rewards, messages):
    group = TrajectoryGroupFactory(
        run=run, step=step, split=split, scenario=scenario, reward_mean=sum(rewards) / len(rewards)
    )
    for i, reward in enumerate(rewards):
        TrajectoryFactory(
            group=group,
            index=i,
            reward=reward,
            advantage=reward - group.reward_mean,
            messages=messages,
            prompt_tokens=20,
            completion_tokens=5 + i,
            duration_ms=100 * (i + 1),
            error="" if reward is not None else "ValueError: bad tool call",
        )
    return group


@pytest.fixture
def run_with_steps(alice):
    """alice's running run: step 1 (train), step 2 (train + validation), both committed."""
    run = RunFactory(
        owner=alice,
        name="capitals",
        status="running",
        num_steps=2,
        tags=["geo"],
        config={"num_steps": 2, "group_size": 2, "train": {"learning_rate": 1e-5}},
    )
    train = Scenario.objects.filter(scenario_set=run.scenario_set, split="train").first()
    val = Scenario.objects.filter(scenario_set=run.scenario_set, split="validation").first()
    _group(run, 1, "train", train, [1.0, 0.0], TOOL_MESSAGES)
    StepFactory(
        run=run,
        step=1,
        reward_mean=0.5,
        reward_std=0.5,
        metrics={
            "loss": 0.25,
            "kl": 0.01,
            "grad_norm": 1.5,
            "rollouts": 2,
            "rollout_errors": 0,
            "completion_tokens_total": 11,
        },
        timings={"rollouts": 2.0, "train": 0.5, "step": 3.0},
        duration_s=3.0,
    )
    _group(run, 2, "train", train, [1.0, 1.0], TOOL_MESSAGES)
    _group(
        run,
        2,
        "validation",
        val,
        [0.75],
        [{"role": "user", "content": "Capital of Peru?"}, {"role": "assistant", "content": "Lima"}],
    )
    StepFactory(
        run=run,
        step=2,
        reward_mean=1.0,
        reward_std=0.0,
        val_reward=0.75,
        metrics={
            "loss": 0.125,
            "kl": 0.02,
            "grad_norm": 0.75,
            "rollouts": 2,
            "rollout_errors": 0,
            "completion_tokens_total": 11,
            "val_reward": 0.75,
        },
        timings={"rollouts": 1.0, "train": 0.5, "validation": 0.4, "step": 2.0},
        duration_s=2.0,
    )
    run.steps_done = 2
    run.save(update_fields=["steps_done"])
    return run


class Recorder:
    """What the endpoint received: a list of (method, path, headers, parsed JSON body)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.status = 207
        self.reply: dict | None = None

    def events(self, kind=None):
        out = [e for r in self.requests for e in (r["body"] or {}).get("batch", [])]
        return [e for e in out if kind is None or e["type"] == kind]


def start_recording_server(port: int = 0) -> Recorder:
    """A local HTTP server recording every request and answering like Langfuse's ingestion endpoint, on
    `port` (0: a free one). Call .stop() when done (the recording_server fixture does)."""
    rec = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:  # recorded all the same: what matters may be the headers
                body = None
            rec.requests.append({"method": "POST", "path": self.path, "headers": dict(self.headers), "body": body})
            reply = (
                rec.reply
                if rec.reply is not None
                else {
                    "successes": [{"id": e["id"], "status": 201} for e in (body or {}).get("batch", [])],
                    "errors": [],
                }
            )
            data = json.dumps(reply).encode()
            self.send_response(rec.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    rec.url = f"http://127.0.0.1:{server.server_address[1]}"

    def stop():
        server.shutdown()
        server.server_close()

    rec.stop = stop
    return rec


@pytest.fixture
def recording_server(settings):
    """A local HTTP server recording every request and answering like Langfuse's ingestion endpoint."""
    rec = start_recording_server()
    egress_allow(settings, rec.url)
    yield rec
    rec.stop()


@pytest.fixture(autouse=True)
def _no_third_party_error_reports(monkeypatch):
    """The W&B and Weave clients report their own errors to a third party by default; not from tests."""
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
