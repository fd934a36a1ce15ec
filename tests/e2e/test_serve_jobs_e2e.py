"""Answer diffs and playground sessions through the serving thread and a real vLLM server, scored by real
reward code in the jailed sandbox; a diff on a finished run is checked against a direct evaluation."""

import csv
import io
import json
from unittest import mock

import httpx
import pytest

from rollouts.services import reward_create
from training.serving.models import ServeJob
from training.serving.selectors import diff_scenarios
from training.serving.services.serve_jobs import (
    TOP_LOGPROBS,
    diff_create,
    playground_create,
    scenario_messages,
    serve_job_execute,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# The reward the jail runs; _length_reward below is the same rule, computed here for the direct evaluation.
LENGTH_REWARD = """
def reward(trajectory, scenario) -> float:
    answer = trajectory.messages()[-1]["content"] or ""
    return min(1.0, len(answer) / 40)
"""


def _length_reward(text: str) -> float:
    return min(1.0, len(text) / 40)


def _queued(django_capture_on_commit_callbacks, create, **kwargs) -> ServeJob:
    with (
        mock.patch("training.serving.tasks.serve_job_execute_task.apply_async") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        job = create(**kwargs)
    assert send.call_args.kwargs["args"] == (job.id,)  # queued after the commit
    return job


def _direct(vllm_server, name: str, messages, *, n: int, seed: int, max_tokens: int) -> list[str]:
    answer = httpx.post(
        f"{vllm_server.base_url}/chat/completions",
        headers=vllm_server.headers,
        json={
            "model": name,
            "messages": messages,
            "n": n,
            "temperature": 0.0,
            "max_tokens": max_tokens,
            "seed": seed,
            "logprobs": True,
            "top_logprobs": TOP_LOGPROBS,
        },
        timeout=300,
    ).json()
    return [c["message"]["content"] for c in sorted(answer["choices"], key=lambda c: c["index"])]


def test_a_diff_on_a_finished_run_matches_a_direct_evaluation(
    served_run, serving_worker, vllm_server, django_capture_on_commit_callbacks, client
):
    serving_worker(served_run["model"])
    alice, run, ckpt = served_run["alice"], served_run["run"], served_run["checkpoint"]
    version = reward_create(owner=alice, name="length", content=LENGTH_REWARD)
    base = served_run["model"].name
    job = _queued(
        django_capture_on_commit_callbacks,
        diff_create,
        user=alice,
        model_a=base,
        model_b=f"run-{run.id}@latest",
        scenario_set=run.scenario_set,
        reward_version=version,
        samples=1,
        max_tokens=16,
        seed=5,
        # Greedy: seeded sampling at temperature 1 did not repeat exactly on the CPU build (the same request
        # sent twice parted after a few tokens), so only greedy answers can be compared token for token.
        temperature=0.0,
    )
    serve_job_execute(job_id=job.id)
    job.refresh_from_db()
    assert job.status == "done", job.error
    rows = list(diff_scenarios(job=job))
    held_out = list(run.scenario_set.scenarios.filter(split="validation"))
    assert {r.scenario_id for r in rows} == {s.id for s in held_out} and len(rows) == 2

    # The direct evaluation: vLLM asked for each held-out scenario under each policy with the same seed, and
    # the reward's rule applied here.
    for row in rows:
        messages = scenario_messages(row.scenario.data)
        seed = 5 + row.scenario.index
        a = _direct(vllm_server, vllm_server.ensure_base(), messages, n=1, seed=seed, max_tokens=16)
        name = vllm_server.ensure_adapter(f"run-{run.id}@1", ckpt.path)
        b = _direct(vllm_server, name, messages, n=1, seed=seed, max_tokens=16)
        assert [x["content"] for x in row.answers_a] == a
        assert [x["content"] for x in row.answers_b] == b
        assert row.reward_a == pytest.approx(_length_reward(a[0]))
        assert row.reward_b == pytest.approx(_length_reward(b[0]))
        assert [x["reward"] for x in row.answers_b] == pytest.approx([_length_reward(t) for t in b])
        assert row.delta == pytest.approx(row.reward_b - row.reward_a)
    assert [abs(r.delta) for r in rows] == sorted((abs(r.delta) for r in rows), reverse=True)
    assert job.result["scenarios"] == 2
    assert job.result["mean_delta"] == pytest.approx(sum(r.delta for r in rows) / 2)

    # Exports: the same rows as JSON and CSV, biggest change first.
    client.force_login(alice)
    exported = json.loads(client.get(f"/api/v1/diffs/{job.id}/export/?as=json").content)
    assert [s["index"] for s in exported["scenarios"]] == [r.index for r in rows]
    lines = list(csv.DictReader(io.StringIO(client.get(f"/api/v1/diffs/{job.id}/export/?as=csv").content.decode())))
    assert [int(x["index"]) for x in lines] == [r.index for r in rows]
    assert float(lines[0]["delta"]) == pytest.approx(rows[0].delta)
    page = client.get(f"/api/v1/diffs/{job.id}/scenarios/").json()
    assert page["count"] == 2 and page["results"][0]["index"] == rows[0].index


def test_a_playground_session_answers_with_each_model_scores_and_keeps_logprobs_and_tool_calls(
    served_run, serving_worker, django_capture_on_commit_callbacks
):
    serving_worker(served_run["model"])
    alice, run = served_run["alice"], served_run["run"]
    version = reward_create(owner=alice, name="length", content=LENGTH_REWARD)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    job = _queued(
        django_capture_on_commit_callbacks,
        playground_create,
        user=alice,
        models=[served_run["model"].name, f"run-{run.id}@1"],
        prompt="Say something about the sea.",
        reward_version=version,
        samples=2,
        max_tokens=12,
    )
    serve_job_execute(job_id=job.id)
    job.refresh_from_db()
    assert job.status == "done", job.error
    columns = job.result["columns"]
    assert [c["model"] for c in columns] == [served_run["model"].name, f"run-{run.id}@1"]
    for column in columns:
        assert len(column["answers"]) == 2 and not column["error"]
        for answer in column["answers"]:
            assert answer["reward"] == pytest.approx(_length_reward(answer["content"]))
            assert answer["tokens"] and all(len(t["top"]) == TOP_LOGPROBS for t in answer["tokens"])
            assert len(answer["tokens"]) <= 12 and all(t["logprob"] <= 0 for t in answer["tokens"])

    called = _queued(
        django_capture_on_commit_callbacks,
        playground_create,
        user=alice,
        models=[served_run["model"].name],
        prompt="What is the weather in Paris?",
        tools=tools,
        tool_choice="get_weather",
        samples=1,
        max_tokens=128,
        temperature=0,
    )
    serve_job_execute(job_id=called.id)
    called.refresh_from_db()
    answer = called.result["columns"][0]["answers"][0]
    assert answer["tool_calls"][0]["function"]["name"] == "get_weather", called.result


def test_another_users_checkpoint_cannot_be_put_in_a_playground_or_diff(served_run):
    from artweb.errors import ApplicationError

    run = served_run["run"]
    with pytest.raises(ApplicationError, match="does not exist or you do not have access"):
        playground_create(user=served_run["bob"], models=[f"run-{run.id}@1"], prompt="hi")
