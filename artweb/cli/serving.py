"""Commands for using what a run trained: chat with a model, answer diffs between two, checkpoint aliases."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from artweb.cli.base import cli, client_from, console, print_json
from artweb.cli.resources import checkpoints


@cli.command("chat")
@click.argument("model", required=False)
@click.argument("prompt", required=False)
@click.option("--system", default="", help="A system message first.")
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--temperature", type=float, default=None, help="Default: the model's own.")
@click.option("--no-stream", is_flag=True, help="Wait for the whole answer instead of printing it as it comes.")
@click.option("--logprobs", is_flag=True, help="Print each token with its log-probability after the answer.")
@click.option("--list", "list_models", is_flag=True, help="List the names MODEL may take, and exit.")
@click.pass_context
def chat(ctx, model, prompt, system, max_tokens, temperature, no_stream, logprobs, list_models):
    """Chat with MODEL: a base model, <run>@<step>, <run>@best, <run>@latest or an alias.

    With PROMPT, answer it and exit (`-` reads it from stdin); without, a conversation: one line per
    turn, an empty line or Ctrl-D ends it."""
    with client_from(ctx) as api:
        if list_models:
            for m in api.served_models():
                click.echo(m["id"])
            return
        if not model:
            raise click.UsageError("Name the MODEL to chat with (artweb chat --list shows the names).")
        messages = [{"role": "system", "content": system}] if system else []
        params = {"max_tokens": max_tokens}
        if temperature is not None:
            params["temperature"] = temperature
        if logprobs:
            params["logprobs"] = True
        once = prompt is not None
        while True:
            if prompt is None:
                try:
                    prompt = click.prompt("you", prompt_suffix="> ", default="", show_default=False)
                except (EOFError, click.Abort):
                    return
                if not prompt.strip():
                    return
            elif prompt == "-":
                prompt = sys.stdin.read()
            messages.append({"role": "user", "content": prompt})
            text, tokens = "", []
            if no_stream:
                answer = api.chat(model, messages, **params)
                choice = answer["choices"][0]
                text = choice["message"].get("content") or ""
                click.echo(text)
                for call in choice["message"].get("tool_calls") or []:
                    click.echo(f"[tool call] {call['function']['name']}({call['function']['arguments']})")
                tokens = ((choice.get("logprobs") or {}).get("content")) or []
            else:
                for chunk in api.chat_stream(model, messages, **params):
                    for choice in chunk.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content") or ""
                        text += piece
                        click.echo(piece, nl=False)
                        tokens += ((choice.get("logprobs") or {}).get("content")) or []
                click.echo()
            if logprobs:
                for t in tokens:
                    click.echo(f"  {t['token']!r}\t{t['logprob']:.3f}")
            messages.append({"role": "assistant", "content": text})
            if once:
                return
            prompt = None


@checkpoints.command("alias")
@click.argument("checkpoint_id", type=int)
@click.argument("alias")
@click.option("--remove", is_flag=True, help="Take the alias away instead.")
@click.pass_context
def checkpoints_alias(ctx, checkpoint_id, alias, remove):
    """Serve a checkpoint under ALIAS (`artweb chat ALIAS`); it is promoted."""
    with client_from(ctx) as api:
        if remove:
            api.checkpoint_alias_delete(checkpoint_id, alias)
            click.echo(f"alias {alias} removed")
            return
        a = api.checkpoint_alias(checkpoint_id, alias)
    click.echo(f"checkpoint {a['checkpoint']} (run {a['run']}, step {a['step']}) is served as {a['name']}")


@cli.group("diff")
def diff():
    """Answer diffs: two models answer a scenario set's held-out scenarios; what changed, per scenario."""


def _rows_table(rows, limit: int) -> Table:
    table = Table("scenario", "reward A", "reward B", "change", "answer A", "answer B")
    fmt = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
    for r in rows[:limit]:
        first = lambda answers: (answers[0]["content"] if answers else "")[:60]  # noqa: E731
        table.add_row(
            f"#{r['index']}",
            fmt(r["reward_a"]),
            fmt(r["reward_b"]),
            fmt(r["delta"]),
            first(r["answers_a"]),
            first(r["answers_b"]),
        )
    return table


def _show(api, job: dict, limit: int) -> None:
    if job["status"] == "failed":
        click.echo(f"diff {job['id']} failed: {job['error']}", err=True)
        sys.exit(1)
    s = job["result"]
    console.print(
        f"diff {job['id']}: {job['models'][0]} -> {job['models'][1]} on {s['scenarios']} scenarios; "
        f"mean reward {s['mean_a']} -> {s['mean_b']} (change {s['mean_delta']}); "
        f"{s['improved']} improved, {s['regressed']} regressed"
    )
    console.print(_rows_table(list(api.diff_scenarios(job["id"])), limit))


@diff.command("start")
@click.argument("model_a")
@click.argument("model_b")
@click.option("--scenarios", "scenario_set", required=True, help="Scenario set id or name (its held-out split).")
@click.option("--reward", required=True, help="Reward function id or name (its newest version).")
@click.option("--samples", type=int, default=4, show_default=True, help="Answers per scenario and model.")
@click.option("--max-scenarios", type=int, default=50, show_default=True)
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-wait", is_flag=True, help="Queue it and print its id.")
@click.option("--top", type=int, default=20, show_default=True, help="Scenarios shown, biggest change first.")
@click.pass_context
def diff_start(
    ctx, model_a, model_b, scenario_set, reward, samples, max_scenarios, max_tokens, temperature, seed, no_wait, top
):
    """Queue a diff of MODEL_A against MODEL_B, wait for it, print the biggest changes."""
    with client_from(ctx) as api:
        job = api.diff_create(
            model_a,
            model_b,
            scenario_set=int(scenario_set) if scenario_set.isdigit() else scenario_set,
            reward=int(reward) if reward.isdigit() else reward,
            samples=samples,
            max_scenarios=max_scenarios,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
        )
        if no_wait:
            click.echo(job["id"])
            return
        _show(api, api.job_wait(job), top)


@diff.command("show")
@click.argument("diff_id", type=int)
@click.option("--top", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def diff_show(ctx, diff_id, top, as_json):
    """A diff's summary and its biggest changes (waits while it runs)."""
    with client_from(ctx) as api:
        job = api.job_wait(api.diff(diff_id))
        if as_json:
            print_json({**job, "scenarios": list(api.diff_scenarios(diff_id))})
            return
        _show(api, job, top)


@diff.command("export")
@click.argument("diff_id", type=int)
@click.option("--out", required=True, type=click.Path(dir_okay=False, writable=True))
@click.option("--as", "as_", type=click.Choice(["json", "csv"]), default="json", show_default=True)
@click.pass_context
def diff_export(ctx, diff_id, out, as_):
    """Save a diff (every scenario, both sides' answers and rewards) as JSON or CSV."""
    with client_from(ctx) as api:
        size = api.diff_export(diff_id, out, as_=as_)
    click.echo(f"{size} bytes written to {out}")
