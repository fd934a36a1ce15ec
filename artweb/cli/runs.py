"""Commands for runs: list, show, start from a run file, watch live, control, events, export."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from artweb.cli.base import cli, client_from, console, print_json
from artweb.client import Client

FINAL = ("completed", "failed", "cancelled")
# Run-file keys that name things; every other top-level key is a RunConfig setting.
REFERENCE_KEYS = {
    "name",
    "base_model",
    "model",
    "script",
    "script_version",
    "reward",
    "reward_version",
    "scenario_set",
    "scenarios",
    "tags",
    "config",
}
WATCH_SERIES = ["reward_mean", "reward_std", "val_reward", "loss", "kl", "grad_norm", "duration_s"]


# --- runs --------------------------------------------------------------------------------------------


@cli.group()
def runs():
    """List, start, watch, control and export runs."""


def _runs_table(rows) -> Table:
    table = Table("id", "name", "status", "steps", "reward", "model", "created")
    for r in rows:
        reward = "" if r["latest_reward"] is None else f"{r['latest_reward']:.3f}"
        table.add_row(
            str(r["id"]),
            r["name"],
            r["status"],
            f"{r['steps_done']}/{r['num_steps']}",
            reward,
            r["base_model"]["name"],
            r["created_at"][:19].replace("T", " "),
        )
    return table


@runs.command("list")
@click.option(
    "--status",
    type=click.Choice(["queued", "starting", "running", "paused", "waiting", "completed", "failed", "cancelled"]),
    help="waiting: a client-driven run between its ART client's training jobs.",
)
@click.option("--tag")
@click.option("--q", help="Text in the run's or script's name.")
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def runs_list(ctx, status, tag, q, limit, as_json):
    """Your runs, newest first."""
    with client_from(ctx) as api:
        found = api.runs(status=status, tag=tag, q=q, limit=limit)
        total = api.runs_count(status=status, tag=tag, q=q) if len(found) == limit else len(found)
    if as_json:
        print_json(found)
    else:
        console.print(_runs_table(found))
        if total > len(found):
            console.print(f"{len(found)} of {total} runs")


@runs.command("show")
@click.argument("run_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def runs_show(ctx, run_id, as_json):
    """One run: status, progress, what it trains with, its config."""
    with client_from(ctx) as api:
        run = api.run(run_id)
    if as_json:
        print_json(run)
        return
    table = Table(show_header=False)
    for key in (
        "id",
        "name",
        "status",
        "owner",
        "tags",
        "steps_done",
        "num_steps",
        "latest_reward",
        "best_val_reward",
        "created_at",
        "started_at",
        "finished_at",
        "error",
    ):
        table.add_row(key, str(run[key]))
    if queue := run.get("queue"):  # its place in the fair queue while it waits for a GPU worker
        table.add_row("queue", f"#{queue['place']}: {queue['reason']}")
    table.add_row("base model", run["base_model"]["name"])
    if run.get("script"):
        table.add_row("script", f"{run['script']['name']} v{run['script']['version']}")
    else:
        for key, value in _client_rows(run.get("client")):
            table.add_row(key, value)
    table.add_row("reward", f"{run['reward']['name']} v{run['reward']['version']}" if run["reward"] else "-")
    table.add_row("scenario set", run["scenario_set"]["name"])
    table.add_row("config", json.dumps(run["config"]))
    console.print(table)


def _client_rows(client: dict | None) -> list[tuple[str, str]]:
    """A client-driven run's rows in place of its script: where its rollouts run, the client's last
    call, its training jobs."""
    if not client:
        return [("rollouts", "in an ART client")]
    last = client.get("last_job")
    jobs = str(client["jobs"]) + (f" (last: {last['status']})" if last else "")
    return [
        ("rollouts", f"in the ART client {client['model']}" if client.get("model") else "in an ART client"),
        ("last contact", (client.get("contacted_at") or "-")[:19].replace("T", " ")),
        ("training jobs", jobs),
    ]


def load_run_file(path: str) -> dict:
    """A run file (YAML or JSON) → the create payload. References by name or id; RunConfig settings
    under `config:` or at the top level."""
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise click.UsageError(f"{path}: the run file must hold a mapping (name, base_model, script, ...).")
    config = {k: v for k, v in data.items() if k not in REFERENCE_KEYS}
    config.update(data.get("config") or {})
    payload = {
        "name": data.get("name") or Path(path).stem,
        "base_model": data.get("base_model", data.get("model")),
        "script": data.get("script"),
        "reward": data.get("reward"),
        "scenario_set": data.get("scenario_set", data.get("scenarios")),
        "tags": data.get("tags") or [],
        "config": config,
    }
    missing = [k for k in ("base_model", "script", "scenario_set") if payload[k] is None]
    if missing:
        raise click.UsageError(f"{path}: missing {', '.join(missing)}.")
    for key in ("script_version", "reward_version"):
        if data.get(key) is not None:
            payload[key] = data[key]
    return payload


@runs.command("start")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Run file (YAML or JSON): name, base_model, script, reward, scenario_set, config.",
)
@click.option("--name", help="Overrides the file's name.")
@click.option("--watch", is_flag=True, help="Follow the run until it ends.")
@click.pass_context
def runs_start(ctx, config_path, name, watch):
    """Create a run from a run file and queue it."""
    payload = load_run_file(config_path)
    if name:
        payload["name"] = name
    with client_from(ctx) as api:
        run = api.run_create(**payload)
        click.echo(f"run {run['id']} {run['name']!r} {run['status']} ({run['num_steps']} steps)")
        if watch:
            sys.exit(_watch(api, run["id"], interval=2.0))


@runs.command("watch")
@click.argument("run_id", type=int)
@click.option("--interval", default=2.0, show_default=True, help="Seconds between polls.")
@click.option("--timeout", default=None, type=float, help="Give up after this many seconds.")
@click.pass_context
def runs_watch(ctx, run_id, interval, timeout):
    """Live metrics and progress until the run ends (exit 0 when it completed)."""
    with client_from(ctx) as api:
        sys.exit(_watch(api, run_id, interval=interval, timeout=timeout))


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 40) -> str:
    values = values[-width:]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(SPARKS[int((v - lo) / span * (len(SPARKS) - 1))] for v in values)


def _watch(api: Client, run_id: int, *, interval: float, timeout: float | None = None) -> int:
    latest: dict[str, tuple[int, float]] = {}
    rewards: list[float] = []
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task(f"run {run_id}", total=None, status="")

    def render():
        table = Table("metric", "step", "value", box=None)
        for name in WATCH_SERIES:
            if name in latest:
                step, value = latest[name]
                table.add_row(name, str(step), f"{value:.4g}")
        grid = Table.grid()
        grid.add_row(progress)
        grid.add_row(table)
        if rewards:
            grid.add_row(f"reward_mean {sparkline(rewards)}")
        return grid

    run = None
    with Live(render(), console=console, refresh_per_second=4, transient=False) as live:
        for run, data in api.metrics_follow(run_id, series=WATCH_SERIES, interval=interval, timeout=timeout):
            for name, points in data["series"].items():
                if points["x"]:
                    latest[name] = (points["x"][-1], points["y"][-1])
            rewards.extend(data["series"].get("reward_mean", {}).get("y", []))
            progress.update(task, total=run["num_steps"], completed=run["steps_done"], status=run["status"])
            live.update(render())
    status = run["status"] if run else "unknown"
    summary = f"run {run_id} {status}: {run['steps_done']}/{run['num_steps']} steps"
    if "reward_mean" in latest:
        summary += f", reward_mean {latest['reward_mean'][1]:.4g} at step {latest['reward_mean'][0]}"
    if run and run.get("error"):
        summary += f" — {run['error']}"
    console.print(summary)
    return 0 if status == "completed" else 1


ACTIONS = {
    "cancel": "Cancel a run (at once if nothing is executing, else at the worker's next check).",
    "pause": "Pause a run (at once if queued, else after the current step).",
    "resume": "Resume a paused run.",
    "retry": "Requeue a failed or cancelled run; it continues from its last checkpoint.",
}


def _action(name: str, method: str):
    @runs.command(name, help=ACTIONS[name])
    @click.argument("run_id", type=int)
    @click.pass_context
    def command(ctx, run_id):
        with client_from(ctx) as api:
            run = getattr(api, method)(run_id)
        note = " (stopping at the next check)" if run.get("cancel_requested") and run["status"] not in FINAL else ""
        click.echo(f"run {run['id']} {run['status']}{note}")

    return command


for _name in ACTIONS:
    _action(_name, f"run_{_name}")


@runs.command("events")
@click.argument("run_id", type=int)
@click.pass_context
def runs_events(ctx, run_id):
    """The run's timeline."""
    with client_from(ctx) as api:
        for e in api.events(run_id):
            click.echo(f"{e['created_at'][:19].replace('T', ' ')}  {e['kind']:<20} {e['message']}")


@runs.command("export")
@click.argument("run_id", type=int)
@click.option("--out", required=True, type=click.Path(dir_okay=False, writable=True))
@click.option("--step", type=int)
@click.option("--split", type=click.Choice(["train", "validation"]))
@click.option("--min-reward", type=float)
@click.option("--max-reward", type=float)
@click.option("--q", help="Text in the messages.")
@click.option("--has-error/--no-error", default=None)
@click.pass_context
def runs_export(ctx, run_id, out, step, split, min_reward, max_reward, q, has_error):
    """Save the run's trajectories as JSON Lines."""
    with client_from(ctx) as api:
        size = api.trajectories_export(
            run_id, out, step=step, split=split, min_reward=min_reward, max_reward=max_reward, q=q, has_error=has_error
        )
    with open(out, "rb") as fh:
        lines = sum(1 for _ in fh)
    click.echo(f"{lines} trajectories ({size} bytes) written to {out}")
