"""Take the documentation's screenshots from the real pages.

    python docs/screenshots.py [--out docs/img]

Creates a test database (ARTWEB_TEST_DB_NAME, default test_artweb_screenshots, on the PostgreSQL that
DATABASE_URL names), loads the demo task with `seed_demo`, and plays the worker for a few runs of the
example task: each step's groups, advantages and record are written by the same services a worker's step
uses, from answers made up here and scored by the example reward function itself. A re-score then runs
for real, in the jail when this machine can build one. The ASGI app is started against that database
and Debian's Chromium (ARTWEB_CHROMIUM, default /usr/bin/chromium) captures each page at 1280 pixels
wide; the PNGs are reduced to a palette. The test database and the data dir are removed at the end.

Redis: REDIS_URL (live updates, cache) and ARTWEB_TEST_IDLE_BROKER, a Redis database no worker reads
(default redis://127.0.0.1:6379/15), where the runs' messages stay unread.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The default model's files come from the usual data dir (converted there on first use); the models the
# pages show are registered by Hub id, from a Hugging Face cache of this script's own holding those files.
MODELS_DATA_DIR = Path(os.environ.get("ARTWEB_DATA_DIR", ROOT / "data"))
DATA_DIR = Path(tempfile.mkdtemp(prefix="artweb-screenshots-"))
IDLE_BROKER = os.environ.get("ARTWEB_TEST_IDLE_BROKER", "redis://127.0.0.1:6379/15")
os.environ.pop("HF_HUB_CACHE", None)
os.environ.update(
    DJANGO_SETTINGS_MODULE="artweb.settings",
    ARTWEB_DATA_DIR=str(DATA_DIR),
    HF_HOME=str(DATA_DIR / "hf"),
    # Inference servers' leftovers are swept from the temporary directory: make it this script's own.
    TMPDIR=str(DATA_DIR),
    ARTWEB_CHANNEL_PREFIX=f"artweb-screenshots-{uuid.uuid4().hex[:8]}",
    CELERY_BROKER_URL=IDLE_BROKER,
    DB_CONN_MAX_AGE="0",
)
os.environ.setdefault("ARTWEB_TEST_DB_NAME", "test_artweb_screenshots")

PASSWORD = "screenshots-pass-1"
WIDTH, HEIGHT = 1280, 800
EXAMPLES = ROOT / "rollouts" / "examples"
SYSTEM = "You are a concise writer. Answer with a single sentence."

# --- answers the policy might give, better with each step ---------------------------------------------

CORES = ("{Topic} always makes me think of {word}.", "{Topic} brings {word} to mind.", "I see {word} in {topic}.")
PLAIN = ("{Topic} is calm and full of life.", "I love {topic} more than anything.", "{Topic} is beautiful today.")
FILLERS = (
    "and every time I see it I remember the long summer afternoons of my childhood",
    "which reminds me that the world is full of small wonders worth noticing",
    "while the people around me hurry past without looking up at all",
    "because nothing else in the whole wide world feels quite the same",
)


def answer(scenario: dict, skill: float, rng: random.Random) -> str:
    """One sentence for the example task: with probability `skill` it uses the word and stays short."""
    topic = scenario["topic"]
    fields = {"topic": topic, "Topic": topic[0].upper() + topic[1:], "word": scenario["word"]}
    text = rng.choice(CORES if rng.random() < 0.35 + 0.6 * skill else PLAIN).format(**fields)
    if rng.random() > skill:
        text = text[:-1] + ", " + " ".join(rng.sample(FILLERS, rng.randint(1, 2))) + "."
    return text


def example_reward():
    spec = importlib.util.spec_from_file_location("example_reward", EXAMPLES / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward


class _Attrs(dict):
    __getattr__ = dict.__getitem__


class _Trajectory:
    """What the example reward reads of a trajectory."""

    def __init__(self, messages: list[dict]):
        self._messages, self.metrics = messages, {}

    def messages(self) -> list[dict]:
        return self._messages


class _Result:
    def __init__(self, trajectories: list[dict]):
        self.trajectories = trajectories


def rollout_record(scenario: dict, skill: float, rng: random.Random, reward, *, error: str = "") -> dict:
    """A trajectory as the sandbox sends it back: the conversation, the sampled tokens, reward, metrics."""
    if error:
        return {"messages": [], "reward": None, "error": error, "duration_ms": 120_000, "logs": []}
    text = answer(scenario, skill, rng)
    tokens = int(len(text.split()) * 1.3) + 2
    truncated = tokens > 48
    tokens = min(tokens, 48)
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": scenario["prompt"]},
        {
            "role": "assistant",
            "content": text,
            "token_ids": [rng.randrange(49152) for _ in range(tokens)],
            "logprobs": [round(-rng.expovariate(2.5), 4) for _ in range(tokens)],
            "finish_reason": "length" if truncated else "stop",
        },
    ]
    trajectory = _Trajectory(messages)
    value = reward(trajectory, _Attrs(scenario))
    return {
        "messages": messages,
        "reward": value,
        "metrics": trajectory.metrics,
        "metadata": {"word": scenario["word"]},
        "logs": [],
        "prompt_tokens": 62,
        "completion_tokens": tokens,
        "duration_ms": rng.randint(700, 2400),
        "reward_ms": rng.randint(1, 4),
    }


# --- the database --------------------------------------------------------------------------------------


def cache_models(repo_ids: list[str]) -> None:
    """Each Hub id in this script's Hugging Face cache, holding the default model's files: registration
    checks a model's files, and nothing here downloads. (The pages show the ids, not the files.)"""
    from artweb.testing.model_cache import cache_model, model_files
    from training.engine.default_model import ensure_default_model

    model_dir = ensure_default_model(MODELS_DATA_DIR).path.resolve()
    for repo_id in repo_ids:
        cache_model(DATA_DIR / "hf" / "hub", repo_id, model_files(model_dir))


def seed() -> dict:
    """Users, models, uploads and runs; returns the ids the pages need."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from rollouts.models import RewardFunction, RolloutScript, ScenarioSet
    from rollouts.services import reward_version_create, script_create
    from training.exports.services import export_target_create
    from training.services.base_models import base_model_register

    admin = get_user_model().objects.create_superuser("admin", "admin@localhost", PASSWORD)
    cache_models(["HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"])
    smol = base_model_register(
        name="SmolLM2-135M-Instruct",
        source="HuggingFaceTB/SmolLM2-135M-Instruct",
        supports_tools=True,
        recommended_train={"learning_rate": 2e-4},
    )
    base_model_register(name="qwen2.5-0.5b", source="Qwen/Qwen2.5-0.5B-Instruct", owner=admin, max_length=32768)
    # Named to sort after the demo task, so that the launch form opens on the demo, as after `make run`.
    tool_script = script_create(
        owner=admin, name="Tool agent (capitals)", content=(EXAMPLES / "tool_rollout.py").read_text()
    )
    call_command("seed_demo", stdout=open(os.devnull, "w"))
    script = RolloutScript.objects.get(owner=admin, name="Example rollout")
    reward = RewardFunction.objects.get(owner=admin, name="Example reward")
    scenarios = ScenarioSet.objects.get(owner=admin, name="Example scenarios")
    strict = reward_version_create(
        reward=reward,
        content=(EXAMPLES / "reward.py").read_text().replace("(2 * limit)", "limit"),
        note="length credit falls to 0 at twice the limit",
    )
    common = {"owner": admin, "base_model": smol, "scenario_set": scenarios}
    example = {"script_version": script.latest_version, "reward_version": strict.asset.versions.get(number=1)}
    fast = play_run("example lr 2e-4", common, example, steps=20, skill=(0.25, 0.85), tags=["lr-sweep"])
    slow = play_run("example lr 5e-5", common, example, steps=20, skill=(0.25, 0.5), lr=5e-5, tags=["lr-sweep"])
    play_run("example, 40 steps", common, example, steps=8, num_steps=40, skill=(0.3, 0.6), finish=False)
    play_run(
        "capital lookup", common, {"script_version": tool_script}, steps=0, num_steps=10, fail="Timed out", skill=(0, 0)
    )
    queued(common, example)
    # A key of the right shape, never sent: no worker reads this broker, so no export runs.
    export_target_create(
        owner=admin, kind="wandb", settings={"project": "example-agent"}, secret="demo-key-not-real-wxyz"
    )
    rescore = rescore_run(fast, strict)
    # The inspector opens on a step whose groups still differ, at the answer GRPO favoured most.
    best = fast.trajectories.filter(step=INSPECTED_STEP, group__split="train").order_by("-advantage", "id").first()
    return {
        "run": fast.id,
        "compare": (fast.id, slow.id),
        "trajectory": best.id,
        "rescore": rescore,
        "script": script.id,
        "scenarios": scenarios.id,
    }


def play_run(name, common, code, *, steps, skill, num_steps=None, lr=2e-4, tags=(), finish=True, fail=""):
    """A run of the example task, with `steps` steps recorded as a worker records them."""
    from django.utils import timezone

    from rollouts.models import Scenario
    from training.analytics import learning_signals
    from training.analytics.alerts import run_alerts_check
    from training.engine.advantages import compute_advantages
    from training.models import Run
    from training.services.runs import run_create, run_transition
    from training.services.steps.commit import step_commit
    from training.services.steps.groups import advantages_store, groups_persist, reward_stats
    from training.services.steps.leases import run_claim

    config = {"num_steps": num_steps or steps, "train": {"learning_rate": lr}, "val_every": 5, "val_scenarios": 8}
    run = run_create(name=name, config=config, tags=list(tags), **common, **code)
    me = "gpu@demo-worker"
    run_claim(run_id=run.id, me=me)
    run_transition(
        run=run,
        from_statuses=(Run.Status.QUEUED,),
        to_status=Run.Status.STARTING,
        message=f"Worker {me} picked the run up.",
    )
    run_transition(
        run=run,
        from_statuses=(Run.Status.STARTING,),
        to_status=Run.Status.RUNNING,
        message="Inference server ready; training.",
    )
    rng, reward = random.Random(name), example_reward()
    train = list(Scenario.objects.filter(scenario_set=run.scenario_set, split="train").order_by("index"))
    held_out = list(Scenario.objects.filter(scenario_set=run.scenario_set, split="validation").order_by("index"))
    if fail:
        scenarios = rng.sample(train, 4)
        results = [_Result([rollout_record({}, 0, rng, reward, error=TIMEOUT) for _ in range(6)]) for _ in scenarios]
        groups_persist(run, 1, "train", scenarios, results, me=me, failed=True)
        run_transition(
            run=run,
            from_statuses=Run.ACTIVE_STATUSES,
            to_status=Run.Status.FAILED,
            worker="",
            error=f"All 24 rollouts failed, so there is nothing to train on; they are kept under step 1 "
            f"in the trajectory inspector. First error:\n{TIMEOUT}",
        )
        return run
    for step in range(1, steps + 1):
        level = skill[0] + (skill[1] - skill[0]) * (step - 1) / 19
        scenarios = rng.sample(train, 4)
        results = [
            _Result(
                [
                    rollout_record(s.data, level, rng, reward, error=TIMEOUT if rng.random() < 0.01 else "")
                    for _ in range(6)
                ]
            )
            for s in scenarios
        ]
        groups = groups_persist(run, step, "train", scenarios, results, me=me)
        stats = reward_stats(results)
        advantages = compute_advantages([r.trajectories for r in results]).values
        advantages_store(groups, advantages)
        stats.update(learning_signals.advantage_stats(advantages))
        val_reward = None
        if step % 5 == 0 or step == run.num_steps:
            chosen = held_out[:8]
            val = [_Result([rollout_record(s.data, level, rng, reward) for _ in range(2)]) for s in chosen]
            groups_persist(run, step, "validation", chosen, val, me=me)
            val_reward = reward_stats(val)["reward_mean"]
        timings = {
            "rollouts": rng.uniform(3.2, 3.9),
            "persist": 0.05,
            "train": rng.uniform(3.4, 3.8),
            "checkpoint": 0.21,
            "adapter_load": 0.3,
            **({"validation": 1.6} if val_reward else {}),
        }
        timings["step"] = sum(timings.values())
        metrics = {**{k: v for k, v in stats.items() if v is not None}, **trainer_metrics(step, rng)}
        metrics.update({"val_reward": val_reward} if val_reward is not None else {})
        step_commit(
            run,
            step,
            stats,
            val_reward,
            metrics,
            timings,
            DATA_DIR / f"run-{run.id}" / f"step-{step}",
            {"size_bytes": 29_400_000},
        )
        run_alerts_check(run=run, step=step)
    if finish:
        run_transition(
            run=run,
            from_statuses=Run.ACTIVE_STATUSES,
            to_status=Run.Status.COMPLETED,
            message=f"Completed {steps} steps.",
            worker="",
        )
    else:
        Run.objects.filter(id=run.id).update(heartbeat_at=timezone.now())
    return run


TIMEOUT = "Timed out: the rollout did not finish within 120 s (wall clock)."
INSPECTED_STEP = 6


def trainer_metrics(step: int, rng: random.Random) -> dict:
    """The update's own figures (loss, KL, gradient, entropy, throughput), plausible for the example."""
    return {
        "loss": round(rng.gauss(0, 0.02), 4),
        "kl": round(0.0004 * step * rng.uniform(0.8, 1.2), 5),
        "grad_norm": round(rng.uniform(0.05, 0.3), 4),
        "entropy": round(1.9 - 0.03 * step + rng.gauss(0, 0.05), 4),
        "sampler_kl": round(rng.uniform(0.0008, 0.002), 5),
        "tokens_per_second": round(rng.uniform(850, 1150), 1),
        "tokens_trained": rng.randint(380, 620),
        "tokens_processed": rng.randint(600, 860),
    }


def queued(common, code) -> None:
    from training.services.runs import run_create

    run_create(name="example, seed 1", config={"seed": 1}, **common, **code)


def rescore_run(run, reward_version):
    from training.analytics.rescores import rescore_create, rescore_execute

    rescore = rescore_create(user=run.owner, run=run, reward_version=reward_version)
    rescore_execute(rescore_id=rescore.id)
    return rescore.id


def backdate() -> None:
    """Spread the runs over the last hours, as a day of work would: each run and what it recorded move back
    together, so its timeline keeps its order and spacing."""
    from django.db.models import F
    from django.utils import timezone

    from training.models import Checkpoint, Run, RunEvent, RunLog, Step, TrajectoryGroup

    now = timezone.now()
    for age, run in enumerate(Run.objects.order_by("-id")):
        shift = timedelta(hours=3 * age + 1)
        Run.objects.filter(id=run.id).update(
            created_at=F("created_at") - shift,
            started_at=F("started_at") - shift,
            finished_at=F("finished_at") - shift,
            heartbeat_at=now if run.status == Run.Status.RUNNING else F("heartbeat_at"),
        )
        for model in (Checkpoint, RunEvent, RunLog, Step, TrajectoryGroup):
            if any(f.name == "created_at" for f in model._meta.get_fields()):
                model.objects.filter(run=run).update(created_at=F("created_at") - shift)


# --- the pages ------------------------------------------------------------------------------------------


def pages(ids: dict) -> list[tuple[str, str, str | None]]:
    """(file name, address, what to show) of each screenshot: a tab to open (#tab-...), or a heading to
    scroll to; None: the top of the page."""
    run = ids["run"]
    return [
        ("runs", "/", None),
        ("launch", "/runs/new/", None),
        ("run", f"/runs/{run}/", None),
        ("run-checkpoints", f"/runs/{run}/", "#tab-checkpoints"),
        ("trajectories", f"/runs/{run}/trajectories/?step={INSPECTED_STEP}&split=train&traj={ids['trajectory']}", None),
        ("heatmap", f"/runs/{run}/heatmap/", None),
        ("reward-health", f"/runs/{run}/health/", None),
        ("rescore", f"/rescores/{ids['rescore']}/", None),
        ("compare", "/compare/?" + "&".join(f"runs={i}" for i in ids["compare"]), None),
        ("models", "/models/", None),
        ("script", f"/scripts/{ids['script']}/", "#code-h"),
        ("scenarios", f"/scenarios/{ids['scenarios']}/", None),
        ("exports", "/exports/", None),
        ("playground", "/playground/", None),
    ]


def capture(url: str, shots: list, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    from artweb.testing.web import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_context(base_url=url, viewport={"width": WIDTH, "height": HEIGHT}).new_page()
        page.goto("/accounts/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url("**/")
        for name, path, show in shots:
            page.goto(path, wait_until="networkidle")
            if show and show.startswith("#tab-"):
                page.click(show)
            elif show:
                page.evaluate(f"document.querySelector('{show}').scrollIntoView()")
            page.wait_for_timeout(1500)  # charts finish drawing, the live state settles
            page.screenshot(path=str(out / f"{name}.png"))
            print(f"{name}.png  {path}")
        browser.close()


def shrink(path: Path) -> None:
    """A palette of 128 colours: the pages' flat colours survive, and the file is a fraction of the size."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small.save(path, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import django

    django.setup()
    from django.db import connection

    from artweb.testing.web import AsgiServer, database_url

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    server = None
    try:
        ids = seed()
        backdate()
        connection.close()
        server = AsgiServer(
            database_url=database_url(connection.settings_dict),
            channel_prefix=os.environ["ARTWEB_CHANNEL_PREFIX"],
            broker_url=IDLE_BROKER,
            log_path=DATA_DIR / "asgi.log",
        ).start()
        shots = pages(ids)
        capture(server.url, shots, args.out)
        for name, _, _ in shots:
            shrink(args.out / f"{name}.png")
        total = sum((args.out / f"{name}.png").stat().st_size for name, _, _ in shots)
        print(f"{len(shots)} screenshots in {args.out}, {total / 1e6:.2f} MB")
    finally:
        if server is not None:
            server.stop()
        connection.creation.destroy_test_db(old_name, verbosity=0)
        shutil.rmtree(DATA_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
