"""`artweb chat`, `artweb checkpoints alias` and `artweb diff` against the ASGI app, with the serving thread
on the session's real vLLM server (tests/e2e/serving.py); the diff job itself is run here, as the
default queue's worker would run it."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys

import httpx
import pytest

from rollouts.services import reward_create
from tests.e2e import serving
from training.serving.models import ServeJob
from training.serving.services.serve_jobs import serve_job_execute

pytestmark = pytest.mark.timeout(900)

served_run = serving.served_run
serving_worker = serving.serving_worker
web = serving.web
REWARD = """
def reward(trajectory, scenario) -> float:
    return min(1.0, len(trajectory.messages()[-1]["content"] or "") / 40)
"""


def artweb(url: str, token: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTWEB_")}
    env.update(ARTWEB_URL=url, ARTWEB_TOKEN=token)
    done = subprocess.run(
        [sys.executable, "-m", "artweb.cli", *args], env=env, capture_output=True, text=True, timeout=600
    )
    if check:
        assert done.returncode == 0, done.stderr + done.stdout
    return done


def test_it_chats_with_a_checkpoint_aliases_it_and_runs_a_diff(served_run, serving_worker, web, tmp_path):
    serving_worker(served_run["model"])
    token, run = served_run["alice_token"], served_run["run"]
    base = served_run["model"].name

    listed = artweb(web.url, token, "chat", "--list").stdout.split()
    assert base in listed and f"run-{run.id}@latest" in listed

    streamed = artweb(
        web.url, token, "chat", f"run-{run.id}@1", "Name a colour.", "--max-tokens", "8", "--temperature", "0"
    )
    whole = httpx.post(
        f"{web.url}/api/v1/openai/chat/completions",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "model": f"run-{run.id}@1",
            "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=300,
    ).json()
    assert streamed.stdout.strip() == whole["choices"][0]["message"]["content"].strip() != ""

    aliased = artweb(web.url, token, "checkpoints", "alias", str(served_run["checkpoint"].id), "colours")
    assert "is served as colours" in aliased.stdout
    again = artweb(
        web.url,
        token,
        "chat",
        "colours",
        "Name a colour.",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--no-stream",
        "--logprobs",
    )
    assert again.stdout.splitlines()[0].strip() == whole["choices"][0]["message"]["content"].strip()
    assert "\t-" in again.stdout or "\t0.000" in again.stdout  # one line per token with its log-probability

    denied = artweb(web.url, served_run["bob_token"], "chat", "colours", "hi", check=False)
    assert denied.returncode == 1 and "does not exist or you do not have access" in denied.stderr

    reward_create(owner=served_run["alice"], name="length", content=REWARD)
    queued = artweb(
        web.url,
        token,
        "diff",
        "start",
        base,
        f"run-{run.id}@1",
        "--scenarios",
        run.scenario_set.name,
        "--reward",
        "length",
        "--samples",
        "1",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        "--no-wait",
    )
    job_id = int(queued.stdout.strip())
    assert ServeJob.objects.get(id=job_id).status == "queued"
    serve_job_execute(job_id=job_id)
    shown = artweb(web.url, token, "diff", "show", str(job_id))
    assert f"diff {job_id}: {base} -> run-{run.id}@1 on 2 scenarios" in shown.stdout
    out = tmp_path / "diff.csv"
    artweb(web.url, token, "diff", "export", str(job_id), "--out", str(out), "--as", "csv")
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 2 and {"reward_a", "reward_b", "delta", "answer_a", "answer_b"} <= set(rows[0])
