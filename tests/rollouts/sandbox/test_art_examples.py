"""ART's own examples, 2048 and Temporal Clue (from ART's sdist: tests/rollouts/art_bundles.py), unchanged but
for the import of 2048's helper module, run
through the real jail against the session's vLLM server with the default model, in a dry run: each rollout
plays against the model and scores itself with ART's own reward (tests/cli/test_art_examples_cli.py
trains on them)."""

from __future__ import annotations

import math

import pytest

from rollouts.sandbox.bundles import bundle_read, bundle_store
from rollouts.sandbox.rollouts import dry_run
from tests.rollouts.art_bundles import art_sdist, bundle_files, bundle_folder, scenarios
from tests.rollouts.bundle_zips import make_zip

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
_ = art_sdist  # the session fixture, used by name


def dry_run_of(example, vllm_server, tmp_path, sdist):
    folder = bundle_folder(example, tmp_path, sdist)
    bundle = bundle_read(make_zip(bundle_files(folder)))
    return dry_run(
        script=bundle.rollout_bytes.decode(),
        reward=None,
        scenarios=scenarios(example, folder),
        base_url=vllm_server.base_url,
        api_key=vllm_server.api_key,
        model_name=vllm_server.ensure_base(),
        sampling={"max_tokens": 64},
        max_scenarios=2,
        timeout_s=240,
        bundle=bundle_store(bundle, tmp_path / "bundles"),
    )


def test_ARTs_2048_plays_the_default_model_and_scores_its_games(vllm_server, art_sdist, tmp_path):
    result = dry_run_of("2048", vllm_server, tmp_path, art_sdist)
    assert result["errors"] == [], result["errors"]
    assert len(result["trajectories"]) == 2
    for trajectory in result["trajectories"]:
        # ART's reward: the board's highest cell and total on a log scale (2 for a won game); -1 would be an
        # invalid move, which this version of the example then scores by the board all the same.
        assert -1 <= trajectory["reward"] <= 2 and math.isfinite(trajectory["reward"])
        moves = [m for m in trajectory["messages"] if m["role"] == "assistant"]
        assert moves and all(m["token_ids"] for m in moves)
        # Each answer was a move, but for the last one where it was not.
        metrics = trajectory["metrics"]
        assert metrics["num_moves"] + metrics["invalid_move"] == len(moves)


def test_ARTs_temporal_clue_answers_its_puzzles_and_scores_them(vllm_server, art_sdist, tmp_path):
    result = dry_run_of("temporal_clue", vllm_server, tmp_path, art_sdist)
    assert result["errors"] == [], result["errors"]
    assert len(result["trajectories"]) == 2
    for trajectory in result["trajectories"]:
        # The share of the puzzle's questions answered right, kept as ART's `acc` metric too.
        puzzle = scenarios("temporal_clue", tmp_path / "temporal_clue")[trajectory["scenario_index"]]
        right = trajectory["reward"] * len(puzzle["solution"])
        assert 0.0 <= trajectory["reward"] <= 1.0 and math.isclose(right, round(right))
        assert trajectory["metrics"]["acc"] == trajectory["reward"]
        assert [m["role"] for m in trajectory["messages"]] == ["user", "assistant"]
