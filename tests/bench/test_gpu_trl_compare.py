"""bench.gpu_trl_compare's pure parts: its defaults, TRL's batching, the reward TRL scores with, the report's
figures (MFU) and its last line. No GPU and no database: the two sides' results are figures written here."""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import gpu_trl_compare as compare
from bench import gpu_trl_report as rep
from bench.gpu_shapes import SHAPES_DIR
from bench.task import EXAMPLES, load_scenarios, messages_for
from bench.trl_grpo import main as trl_main
from bench.trl_grpo import make_reward_func, train_batching, vllm_context

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "rollouts" / "sandbox" / "guest"))

import artweb_sdk as art  # importable once the guest directory is on sys.path
from artweb_sdk.scenario import Scenario

H100 = "NVIDIA H100 80GB HBM3, driver 570.86.15, 80 GiB"


def test_the_gpu_peak_comes_from_its_name():
    assert rep.peak_bf16_flops(H100) == 989e12
    assert rep.peak_bf16_flops("NVIDIA H200, driver 580.159.04, 140 GiB") == 989e12
    assert rep.peak_bf16_flops("NVIDIA A100-SXM4-80GB, driver 535, 80 GiB") == 312e12
    assert rep.peak_bf16_flops("NVIDIA H100 PCIe, driver 535, 80 GiB") == 756e12
    assert rep.peak_bf16_flops("NVIDIA L4, driver 535, 22 GiB") is None
    assert rep.peak_bf16_flops(None) is None


def test_mfu_is_six_flops_per_weight_and_trained_token_over_the_peak():
    # 10,000 trained tokens/s on 7e9 weights: 4.2e14 FLOP/s of an H100's 989e12.
    assert rep.mfu(10_000, 7_000_000_000, 989e12) == pytest.approx(6 * 7e9 * 1e4 / 989e12)
    assert rep.mfu(10_000, 7_000_000_000, 989e12) == pytest.approx(0.42467, abs=1e-5)
    assert rep.mfu(10_000, None, 989e12) is None  # no safetensors to count
    assert rep.mfu(10_000, 7_000_000_000, None) is None  # a GPU whose peak is not known
    assert rep.mfu(float("nan"), 7_000_000_000, 989e12) is None


def _safetensors(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    from safetensors.numpy import save_file

    save_file({name: np.zeros(shape, dtype=np.float16) for name, shape in shapes.items()}, str(path))


def test_the_weights_counted_leave_out_the_embedding_lookup_unless_it_is_the_head(tmp_path):
    vocab, hidden = 100, 8
    untied, tied = tmp_path / "untied", tmp_path / "tied"
    untied.mkdir(), tied.mkdir()
    layers = {"model.layers.0.mlp.up_proj.weight": (32, hidden), "model.norm.weight": (hidden,)}
    # A sharded model with an output head of its own: the input table is a lookup, not counted.
    _safetensors(untied / "model-00001-of-00002.safetensors", {"model.embed_tokens.weight": (vocab, hidden), **layers})
    _safetensors(untied / "model-00002-of-00002.safetensors", {"lm_head.weight": (vocab, hidden)})
    assert rep.matmul_parameters(untied) == vocab * hidden + 32 * hidden + hidden
    # Tied embeddings: the one table is the head.
    _safetensors(tied / "model.safetensors", {"model.embed_tokens.weight": (vocab, hidden), **layers})
    assert rep.matmul_parameters(tied) == vocab * hidden + 32 * hidden + hidden
    assert rep.matmul_parameters(tmp_path) is None  # no safetensors file


def test_trl_runs_one_optimizer_step_per_step_in_micro_batches():
    assert train_batching(8, 16, 8) == (8, 16)  # 128 sequences: 16 accumulated micro-batches of 8
    assert train_batching(8, 16, 0) == (128, 1)  # 0: the whole step at once
    assert train_batching(6, 4, 24) == (24, 1)
    with pytest.raises(ValueError, match=r"must divide a step's 24 sequences .* one of 1, 2, 3, 4, 6, 8, 12, 24"):
        train_batching(6, 4, 5)


def test_trls_vllm_context_holds_a_prompt_and_a_whole_completion():
    assert vllm_context(47, 512, 128) == 623  # the longest prompt, 512 tokens, 64 to spare
    # A small step: at least 4,096 / 24 tokens, so that TRL's 24 sequences hold its 4,096-token budget.
    assert vllm_context(47, 48, 24) == 171


def test_a_micro_batch_that_does_not_divide_the_step_is_refused_up_front(tmp_path, capsys):
    with pytest.raises(SystemExit) as trl:
        trl_main(["train", "--model-dir", str(tmp_path), "--out", str(tmp_path / "out"), "--micro-batch", "5"])
    assert trl.value.code == 2 and "must divide a step's 24 sequences" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything ran
    with pytest.raises(SystemExit) as ours:
        compare.parse_args(["--shape", "qwen2.5-7b", "--trl-micro-batch", "48"])
    assert ours.value.code == 2 and "must divide a step's 128 sequences" in capsys.readouterr().err


def test_a_shape_brings_its_defaults_and_no_shape_keeps_the_old_ones():
    shaped = compare.parse_args(["--shape", "qwen2.5-7b"])
    assert (shaped.steps, shaped.group_size, shaped.scenarios_per_step, shaped.max_tokens) == (4, 8, 16, 512)
    assert (shaped.concurrency, shaped.kv_cache_gb, shaped.trl_vllm_memory) == (128, 16.0, 0.35)
    assert shaped.trl_gradient_checkpointing == "on" and shaped.trl_micro_batch is None  # sized from the model
    plain = compare.parse_args([])
    assert (plain.steps, plain.group_size, plain.scenarios_per_step, plain.max_tokens) == (10, 6, 4, 48)
    assert (plain.concurrency, plain.kv_cache_gb, plain.trl_vllm_memory) == (None, None, 0.3)
    assert plain.trl_gradient_checkpointing == "off" and plain.trl_micro_batch == 0
    assert compare.parse_args(["--shape", "qwen2.5-1.5b", "--steps", "3"]).steps == 3
    assert "qwen2.5-7b" in compare.shape_names() and "qwen2.5-14b" in compare.shape_names()


def test_the_micro_batch_shrinks_with_the_model_and_divides_the_step():
    assert compare.default_micro_batch(1_544_000_000, 128) == 16
    assert compare.default_micro_batch(7_616_000_000, 128) == 8
    assert compare.default_micro_batch(14_770_000_000, 128) == 4
    assert compare.default_micro_batch(7_616_000_000, 18) == 6  # the largest divisor under the cap


def test_trls_command_carries_the_shape_settings(tmp_path):
    args = compare.parse_args(["--shape", "qwen2.5-7b", "--eager", "--trl-sleep-mode"])
    args.trl_micro_batch = 8
    cmd = compare.trl_command(args, tmp_path / "model", tmp_path / "trl", SHAPES_DIR / "reward.py")
    flags = dict(zip(cmd[4::2], cmd[5::2], strict=False))
    assert cmd[2:4] == ["bench.trl_grpo", "train"]
    assert flags["--generation"] == "vllm-colocate" and flags["--gradient-checkpointing"] == "on"
    assert flags["--vllm-memory"] == "0.35" and flags["--micro-batch"] == "8"
    assert flags["--group-size"] == "8" and flags["--scenarios-per-step"] == "16" and flags["--max-tokens"] == "512"
    assert cmd[cmd.index("--reward") + 1] == str(SHAPES_DIR / "reward.py")
    assert "--vllm-sleep-mode" in cmd and "--vllm-eager" in cmd and "--vllm-is-correction" not in cmd
    plain = compare.trl_command(compare.parse_args([]), tmp_path / "model", tmp_path / "trl", None)
    assert "--reward" not in plain and plain[plain.index("--micro-batch") + 1] == "0"


@pytest.mark.parametrize("reward_file", [SHAPES_DIR / "reward.py", EXAMPLES / "reward.py"])
def test_trl_scores_a_completion_as_artwebs_reward_file_does(reward_file):
    namespace: dict = {}
    exec(compile(reward_file.read_text(), str(reward_file), "exec"), namespace)
    scenarios = load_scenarios()["train"][:3]
    answers = ["The blue sea is calm.", "zq#$ 91 blue ~~ \u00e9t\u00e9 xx", ""]
    ours = []
    for scenario, answer in zip(scenarios, answers, strict=True):
        # As a rollout of the example's script ends: the prompt's messages, then the policy's answer.
        trajectory = art.Trajectory(
            messages_and_choices=[*messages_for(scenario), {"role": "assistant", "content": answer}]
        )
        ours.append(namespace["reward"](trajectory, Scenario(scenario)))
    # What TRL hands a reward function: the conversational prompts and completions, and the dataset's columns.
    theirs = make_reward_func(reward_file)(
        prompts=[messages_for(s) for s in scenarios],
        completions=[[{"role": "assistant", "content": a}] for a in answers],
        scenario=[json.dumps(s) for s in scenarios],
    )
    assert theirs == pytest.approx(ours)
    assert len(set(theirs)) == 3  # the three answers score apart, so the check means something


def _artweb(seconds: list[float]) -> dict:
    steps = [
        {
            "seconds": s,
            "timings": {"rollouts": s / 2, "train": s / 4, "step": s},
            "completion_tokens": 65_536,
            "tokens_trained": 65_536,
            "reward_mean": 0.5,
        }
        for s in seconds
    ]
    return {"steps": steps, "gpu_peak_mib": 40 * 1024, "status": "completed"}


def _trl(seconds: list[float]) -> dict:
    steps = [
        {"seconds": s, "generate_seconds": s / 2, "completion_tokens": 65_536, "reward_mean": 0.5} for s in seconds
    ]
    return {
        "steps": steps,
        "gpu_peak_mib": 60 * 1024,
        "command": "python -m bench.trl_grpo train",
        "setup_seconds": 90.0,
        "gradient_checkpointing": True,
        "micro_batch": 8,
        "gradient_accumulation_steps": 16,
        "generation_batch_size": 128,
        "vllm": {"vllm_gpu_memory_utilization": 0.35, "vllm_max_model_length": 623},
    }


def _report(shape: str | None, artweb: dict, trl: dict) -> str:
    args = compare.parse_args(["--shape", shape] if shape else [])
    model = {"label": shape or compare.DEFAULT_LABEL, "words": "a model", "reward_words": "a reward."}
    model["matmul_parameters"] = 7_000_000_000
    meta = {
        "command": "python -m bench.gpu_trl_compare",
        "sandbox": "jailed",
        "versions": {"gpu": H100, "trl": "1.15.0"},
    }
    return rep.report(args, model, artweb, trl, meta)


def test_the_report_ends_with_the_ratio_of_the_median_steps_after_the_first():
    artweb, trl = _artweb([100.0, 10.0, 12.0, 14.0]), _trl([50.0, 20.0, 24.0, 30.0])
    text = _report("qwen2.5-7b", artweb, trl)
    # Steps 2+: 12 / 24; all four steps would give 13 / 27 = 0.48.
    assert text.splitlines()[-1] == "step-time ratio artweb / TRL (qwen2.5-7b): 0.50"
    # artweb's update is the train phase (12 / 4 = 3 s of 65,536 tokens), TRL's the step less generate+score.
    a = rep.artweb_figures(artweb, 7_000_000_000, 989e12)
    assert a["trained_tps"] == pytest.approx(65_536 / 3.0)
    assert a["mfu"] == pytest.approx(65_536 / 3.0 * 6 * 7e9 / 989e12)
    t = rep.trl_figures(trl, 7_000_000_000, 989e12)
    assert (t["generation"], t["update"]) == (12.0, 12.0)
    assert f"| MFU of the update (6N per trained token) | {a['mfu']:.1%} | {t['mfu']:.1%} | |" in text
    assert "| peak GPU memory in use (GiB, nvidia-smi) | 40.0 | 60.0 | |" in text


def test_with_fewer_than_three_steps_every_step_counts_and_no_shape_names_the_default_model():
    text = _report(None, _artweb([30.0, 10.0]), _trl([20.0, 20.0]))
    assert text.splitlines()[-1] == "step-time ratio artweb / TRL (smollm2-135m): 1.00"  # 20 / 20
    assert "median of all steps" in text


def test_an_unknown_gpu_gives_no_mfu():
    artweb, trl = _artweb([10.0, 10.0, 10.0]), _trl([10.0, 10.0, 10.0])
    args = argparse.Namespace(**vars(compare.parse_args(["--shape", "qwen2.5-1.5b"])))
    model = {"label": "qwen2.5-1.5b", "words": "w", "reward_words": "r.", "matmul_parameters": 1_300_000_000}
    meta = {"command": "c", "sandbox": "s", "versions": {"gpu": "NVIDIA L4, driver 1, 22 GiB"}}
    text = rep.report(args, model, artweb, trl, meta)
    assert "| MFU of the update (6N per trained token) | n/a | n/a | |" in text
    assert text.splitlines()[-1] == "step-time ratio artweb / TRL (qwen2.5-1.5b): 1.00"
