"""Hostile reward functions in score mode, against the real jail, proxy and result reader.

A re-score runs a stranger's reward function over stored trajectories with no rollout script and no
policy. Each test runs it through run_scores exactly as a re-score does and checks that the attack got
nothing and ended as recorded per-trajectory errors while well-behaved groups kept their scores. Where
the attack needs a target (a listening PostgreSQL, a secret in the worker's environment), the test shows
the target is there from outside the jail first.
"""

from __future__ import annotations

import os
import socket

import pytest

from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.scores import ScoreGroup, ScoreRequest, run_scores


def stored(text: str) -> dict:
    return {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
        "tools": None,
        "metrics": {},
        "metadata": {},
    }


def request(reward: str, **kwargs) -> ScoreRequest:
    """Two groups of two trajectories, one group per sandbox process."""
    groups = [ScoreGroup(scenario={"i": g}, trajectories=[stored(f"g{g}t{i}") for i in range(2)]) for g in range(2)]
    kwargs.setdefault("limits", SandboxLimits(rollout_timeout_s=20.0))
    return ScoreRequest(groups=groups, reward=reward, sandboxes=2, **kwargs)


def reward_reporting(code: str) -> str:
    """A reward that runs `code` (filling dict `out`) on group 0's trajectories, puts `out` in the metrics
    and returns 1.0; group 1's trajectories are scored plainly."""
    body = "\n".join("        " + line for line in code.splitlines())
    return (
        "import json, os, socket\n\n"
        "def reward(trajectory, scenario):\n"
        "    if scenario['i'] == 0:\n"
        "        out = {}\n"
        f"{body}\n"
        "        trajectory.metrics['out'] = out\n"
        "    return 1.0\n"
    )


def test_a_reward_reaches_neither_the_database_nor_redis_nor_the_network():
    for port in (5432, 6379):  # they are there, for the worker
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    scores = run_scores(
        request(
            reward_reporting(
                "for host, port in [('127.0.0.1', 5432), ('127.0.0.1', 6379), ('8.8.8.8', 53)]:\n"
                "    s = socket.socket()\n"
                "    s.settimeout(2)\n"
                "    try:\n"
                "        s.connect((host, port))\n"
                "        out[f'{host}:{port}'] = 'open'\n"
                "    except OSError as e:\n"
                "        out[f'{host}:{port}'] = type(e).__name__\n"
            )
        )
    )
    out = scores[0][0]["metrics"]["out"]
    assert out["127.0.0.1:5432"] == out["127.0.0.1:6379"] == "ConnectionRefusedError"
    assert "open" not in out.values(), out
    assert [s["reward"] for group in scores for s in group] == [1.0] * 4


def test_a_reward_sees_neither_the_workers_environment_nor_other_groups(monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "hunter2-secret-key")
    monkeypatch.setenv("DATABASE_URL", "postgres://artweb:hunter2@127.0.0.1/artweb")
    assert "hunter2" in os.environ["SECRET_KEY"]  # the worker's own environment has it
    scores = run_scores(
        request(
            reward_reporting(
                "out['env'] = dict(os.environ)\n"
                "leaks = []\n"
                "for p in [p for p in os.listdir('/proc') if p.isdigit()] + [str(os.getppid())]:\n"
                "    try:\n"
                "        if b'hunter2' in open(f'/proc/{p}/environ', 'rb').read():\n"
                "            leaks.append(p)\n"
                "    except OSError:\n"
                "        pass\n"
                "out['leaks'] = leaks\n"
                "out['batch'] = sorted(os.listdir('/batch'))\n"
                "spec = json.load(open('/batch/batch.json'))\n"
                "out['groups'] = [g['index'] for g in spec['groups']]\n"
            )
        )
    )
    out = scores[0][0]["metrics"]["out"]
    assert out["leaks"] == []
    assert not any("hunter2" in v for v in out["env"].values()), out["env"]
    assert {"SECRET_KEY", "DATABASE_URL", "REDIS_URL"}.isdisjoint(out["env"])
    # Its own files only: the reward and its own group's trajectories, not the other sandbox's.
    assert out["batch"] == ["batch.json", "reward.py"]
    assert out["groups"] == [0]


def test_a_score_forged_for_a_trajectory_it_was_not_given_voids_the_sandbox():
    # Group 1 runs in the other sandbox; index 5 is past group 0's two trajectories.
    for group, index in ((1, 0), (0, 5)):
        forge = reward_reporting(
            "fd = int(os.environ['ARTWEB_RESULT_FD'])\n"
            f"line = {{'kind': 'score', 'group': {group}, 'index': {index}, "
            "'score': {'reward': 99.0, 'metrics': {}, 'error': None, 'reward_ms': 1}}\n"
            "os.write(fd, (json.dumps(line) + '\\n').encode())\n"
        )
        scores = run_scores(request(forge))
        assert all(s["reward"] is None and "broke artweb's result protocol" in s["error"] for s in scores[0]), scores[0]
        assert "which it was not given" in scores[0][0]["error"] or "not one of its groups" in scores[0][0]["error"]
        # The other sandbox's scores stand, and the forged 99 is nowhere.
        assert [s["reward"] for s in scores[1]] == [1.0, 1.0]


def test_a_score_forged_for_its_own_trajectory_is_not_believed_either():
    # It writes the score of its own second trajectory early; the real one then arrives for a taken slot.
    forge = reward_reporting(
        "if trajectory.messages()[-1]['content'] == 'g0t0':\n"
        "    fd = int(os.environ['ARTWEB_RESULT_FD'])\n"
        "    line = {'kind': 'score', 'group': 0, 'index': 1, 'score': {'reward': 99.0, 'metrics': {}, "
        "'error': None, 'reward_ms': 1}}\n"
        "    os.write(fd, (json.dumps(line) + '\\n').encode())\n"
    )
    scores = run_scores(request(forge, concurrency=1))
    assert [s["reward"] for s in scores[0]] == [None, None]
    assert all("twice" in s["error"] for s in scores[0]), scores[0]
    assert [s["reward"] for s in scores[1]] == [1.0, 1.0]


def test_a_done_line_forged_before_the_scores_voids_the_sandbox():
    # Once, and alone on the pipe for a second before the scores follow it.
    forge = reward_reporting(
        "import builtins, time\n"
        "if not hasattr(builtins, 'forged'):\n"
        "    builtins.forged = True\n"
        "    os.write(int(os.environ['ARTWEB_RESULT_FD']), b'{\"kind\": \"done\"}\\n')\n"
        "    time.sleep(1)\n"
    )
    scores = run_scores(request(forge, concurrency=1))
    assert all(s["reward"] is None and "said it was done before it sent every result" in s["error"] for s in scores[0])
    assert [s["reward"] for s in scores[1]] == [1.0, 1.0]


def test_garbage_and_impossible_rewards_are_errors_not_scores():
    garbage = reward_reporting("os.write(int(os.environ['ARTWEB_RESULT_FD']), b'not json\\n')\n")
    scores = run_scores(request(garbage))
    assert all("is not JSON" in s["error"] for s in scores[0])
    assert [s["reward"] for s in scores[1]] == [1.0, 1.0]

    nan = run_scores(request("def reward(trajectory, scenario):\n    return float('nan')\n"))
    assert all(s["reward"] is None and "finite number" in s["error"] for group in nan for s in group)


@pytest.mark.slow
def test_a_reward_that_hangs_is_stopped_at_its_limit_and_the_others_are_scored():
    hang = (
        "import time\n\n"
        "def reward(trajectory, scenario):\n"
        "    if trajectory.messages()[-1]['content'] == 'g0t0':\n"
        "        while True:\n"
        "            pass\n"
        "    return 1.0\n"
    )
    scores = run_scores(request(hang, limits=SandboxLimits(rollout_timeout_s=2.0)))
    assert "Timed out: the reward did not finish within 2 s" in scores[0][0]["error"]
    assert [scores[0][1]["reward"], *(s["reward"] for s in scores[1])] == [1.0, 1.0, 1.0]


def test_a_reward_reaches_no_model_through_the_proxy():
    """The proxy is the jail's one way out; in a re-score by a reward function it admits no model at all."""
    scores = run_scores(
        request(
            reward_reporting(
                "import urllib.request, urllib.error\n"
                "base = os.environ['OPENAI_BASE_URL']\n"
                "out['models'] = json.load(urllib.request.urlopen(base + '/models', timeout=5))['data']\n"
                "body = json.dumps({'model': 'SmolLM2-135M-Instruct', 'messages': [{'role': 'user', 'content': 'hi'}]})\n"
                "req = urllib.request.Request(base + '/chat/completions', data=body.encode(), "
                "headers={'Content-Type': 'application/json'})\n"
                "try:\n"
                "    urllib.request.urlopen(req, timeout=5)\n"
                "    out['chat'] = 'answered'\n"
                "except urllib.error.HTTPError as e:\n"
                "    out['chat'] = e.code\n"
            )
        )
    )
    out = scores[0][0]["metrics"]["out"]
    assert out["models"] == []
    assert isinstance(out["chat"], int) and 400 <= out["chat"] < 500, out
