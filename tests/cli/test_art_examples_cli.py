"""ART's own examples, 2048 and Temporal Clue, trained for a few steps through the CLI against a live server:
each is uploaded as a bundle folder (ART's files from its sdist, unchanged but for the import of 2048's helper
module: tests/rollouts/art_bundles.py), its scenarios as a set, and a run with no reward function (the examples set
their own) is started and watched until it completes; a real GPU-queue Celery worker (vLLM CPU server,
PEFT trainer) runs it, and every step's trajectories carry ART's rewards."""

from __future__ import annotations

import json
import math

import pytest

from artweb.testing import stack
from tests.cli import test_cli
from tests.cli.test_cli import PASSWORD, Cli
from tests.rollouts.art_bundles import art_sdist, bundle_folder, scenarios

server_env, alice_login = test_cli.server_env, test_cli.alice_login  # its fixtures
_ = art_sdist  # the session fixture, used by name

STEPS = 2
SETTINGS = {
    "num_steps": STEPS,
    "group_size": 4,
    "scenarios_per_step": 1,
    "max_tokens": 64,
    "val_every": 0,
    "rollout_timeout_s": 600,
    "train": {"learning_rate": 5e-5},
}
# ART's rewards: 2048 gives -1 for a move it cannot parse and up to 2 for a won game; Temporal Clue the
# share of the puzzle's questions answered right.
REWARDS = {"2048": (-1.0, 2.0), "temporal_clue": (0.0, 1.0)}


def train(cli: Cli, example: str, folder, tmp_path) -> None:
    assert "valid" in cli("validate", "script", str(folder)).stdout
    assert "version 1" in cli("upload", "script", str(folder), "--name", f"art-{example}").stdout
    lines = tmp_path / f"{example}.jsonl"
    lines.write_text("".join(json.dumps(s) + "\n" for s in scenarios(example, folder)))
    cli("upload", "scenarios", str(lines), "--name", f"art-{example}", "--validation-fraction", "0")
    run_file = tmp_path / f"{example}-run.json"
    run_file.write_text(
        json.dumps(
            {
                "name": f"art-{example}",
                "model": "SmolLM2-135M-Instruct",
                "script": f"art-{example}",
                "scenarios": f"art-{example}",
                **SETTINGS,
            }
        )
    )
    result = cli("runs", "start", "--config", str(run_file), "--watch", timeout=3000, ok=False)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])


@pytest.mark.vllm
@pytest.mark.worker
@pytest.mark.e2e
@pytest.mark.timeout(5400)
def test_ARTs_2048_and_temporal_clue_train_through_the_cli(
    server_env, alice_login, vllm_model_dir, art_sdist, tmp_path
):
    from training.models import Run, Trajectory
    from training.services import base_model_register

    # Registering a server directory is an operator's job (staff only over the API), done here directly.
    base_model_register(
        name="SmolLM2-135M-Instruct", source=str(vllm_model_dir), local_path=str(vllm_model_dir), supports_tools=True
    )
    web = stack.start_web(server_env, tmp_path / "logs")
    worker = stack.start_gpu_worker(server_env, tmp_path / "logs")
    try:
        cli = Cli(web.extra["url"])
        cli.token = cli("token", "create", "--username", "alice", "--password", PASSWORD).stdout.strip()
        for example in ("2048", "temporal_clue"):
            train(cli, example, bundle_folder(example, tmp_path / "bundles", art_sdist), tmp_path)
            run = Run.objects.get(name=f"art-{example}")
            assert run.status == Run.Status.COMPLETED, worker.tail()
            rows = list(Trajectory.objects.filter(run=run).order_by("step", "group_id", "index"))
            low, high = REWARDS[example]
            assert [r.error for r in rows if r.error] == []
            assert sorted({r.step for r in rows}) == list(range(1, STEPS + 1))
            assert all(r.reward is not None and math.isfinite(r.reward) and low <= r.reward <= high for r in rows)
            by_step = {s: [r.reward for r in rows if r.step == s] for s in range(1, STEPS + 1)}
            print(f"ART's {example}: rewards by step {by_step}")
    finally:
        worker.kill()
        web.kill()
