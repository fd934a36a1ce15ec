"""Commands for export targets: mirror your runs to Weights & Biases, Weave or Langfuse.

    artweb exports create wandb --set project=my-agent --secret        # prompts for the key
    artweb exports create langfuse --run 12 --set public_key=pk-lf-… --secret-stdin < key.txt
    artweb exports test 3
    artweb exports edit 3 --set entity=my-team --disable
    artweb exports delete 3 --yes

Keys are asked for (or read from stdin) rather than taken as a plain argument, which would stay in
the shell's history; the server never sends them back.
"""

from __future__ import annotations

import json
import sys

import click
from rich.table import Table

from artweb.cli.base import cli, client_from, console, print_json

KINDS = ["wandb", "weave", "langfuse"]
SECRET_HELP = "Ask for the key (W&B / Weave: your W&B API key; Langfuse: your secret key); input is hidden."


@cli.group()
def exports():
    """Mirror your runs to Weights & Biases, Weave or Langfuse: add, change, test and delete targets."""


def _settings(pairs: tuple[str, ...]) -> dict:
    """--set key=value pairs; values stay text, the server's schema turns "8" or "true" into their types."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"--set {pair!r}: write it as key=value, e.g. --set project=my-agent.")
        out[key.strip()] = value
    return out


def _secret(secret: str | None, secret_stdin: bool) -> str | None:
    if secret is not None and secret_stdin:
        raise click.UsageError("Give the key with --secret or with --secret-stdin, not both.")
    if secret_stdin:
        return sys.stdin.readline().strip()
    return secret


def _scope(t: dict) -> str:
    return f"run {t['run']}" if t["run"] else "all your runs"


def _key(t: dict) -> str:
    return {"stored": t["secret"], "worker environment": "(worker environment)", "none": "none"}[t["secret_source"]]


def _describe(t: dict) -> str:
    state = "" if t["enabled"] else ", disabled"
    return f"export {t['id']}: {t['kind']} for {_scope(t)} (key {_key(t)}{state})"


def _report(result: dict) -> None:
    if result["ok"]:
        click.echo(f"test event sent: {result['message']}")
    else:
        click.echo(f"test event failed: {result['message']}", err=True)
        sys.exit(1)


@exports.command("list")
@click.option("--run", "run_id", type=int, help="Only the targets of this run.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def exports_list(ctx, run_id, as_json):
    """Your export targets."""
    with client_from(ctx) as api:
        targets = api.export_targets(run=run_id)
    if as_json:
        print_json(targets)
        return
    table = Table("id", "kind", "applies to", "enabled", "settings", "key", "last success", "last error")
    for t in targets:
        settings = ", ".join(f"{k}={v}" for k, v in t["settings"].items() if v not in ("", None))
        table.add_row(
            str(t["id"]),
            t["kind"],
            _scope(t),
            "yes" if t["enabled"] else "no",
            settings,
            _key(t),
            (t["last_success_at"] or "")[:19].replace("T", " "),
            t["last_error"][:80],
        )
    console.print(table)


@exports.command("kinds")
@click.pass_context
def exports_kinds(ctx):
    """The kinds of target and the settings each takes."""
    with client_from(ctx) as api:
        kinds = api.export_target_kinds()
    for k in kinds:
        schema = k["settings_schema"]
        required = set(schema.get("required", []))
        click.echo(f"{k['kind']} ({k['label']}):")
        for name, prop in schema["properties"].items():
            default = "required" if name in required else f"default {json.dumps(prop.get('default'))}"
            click.echo(f"  {name:<24} {prop.get('description', '')} [{default}]")


@exports.command("show")
@click.argument("target_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def exports_show(ctx, target_id, as_json):
    """One export target: its settings, key (last four characters) and latest outcome."""
    with client_from(ctx) as api:
        t = api.export_target(target_id)
    if as_json:
        print_json(t)
        return
    table = Table(show_header=False)
    for key, value in (
        ("id", t["id"]),
        ("kind", t["kind"]),
        ("applies to", _scope(t)),
        ("enabled", t["enabled"]),
        ("key", _key(t)),
        ("last success", t["last_success_at"]),
        ("last error", t["last_error"]),
    ):
        table.add_row(key, "" if value is None else str(value))
    for key, value in t["settings"].items():
        table.add_row(f"settings.{key}", json.dumps(value))
    console.print(table)


@exports.command("create")
@click.argument("kind", type=click.Choice(KINDS))
@click.option("--run", "run_id", type=int, help="For this run only; without it, for all your runs.")
@click.option(
    "--set",
    "pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A setting, e.g. --set project=my-agent (repeat it; `artweb exports kinds` lists them).",
)
@click.option("--secret", prompt="Key", prompt_required=False, hide_input=True, default=None, help=SECRET_HELP)
@click.option("--secret-stdin", is_flag=True, help="Read the key from the first line of standard input.")
@click.option("--disabled", is_flag=True, help="Create it switched off.")
@click.option("--test", "send_test", is_flag=True, help="Send a test event right after.")
@click.pass_context
def exports_create(ctx, kind, run_id, pairs, secret, secret_stdin, disabled, send_test):
    """Add an export target of KIND (wandb, weave or langfuse)."""
    key = _secret(secret, secret_stdin) or ""
    with client_from(ctx) as api:
        t = api.export_target_create(kind=kind, settings=_settings(pairs), secret=key, run=run_id, enabled=not disabled)
        click.echo(f"created {_describe(t)}")
        if send_test:
            _report(api.export_target_test(t["id"]))


@exports.command("edit")
@click.argument("target_id", type=int)
@click.option("--set", "pairs", multiple=True, metavar="KEY=VALUE", help="Change a setting (repeat it).")
@click.option("--unset", "unset", multiple=True, metavar="KEY", help="Put a setting back to its default.")
@click.option(
    "--secret",
    prompt="New key",
    prompt_required=False,
    hide_input=True,
    default=None,
    help="Ask for a new key; without this (or --secret-stdin) the stored key stays.",
)
@click.option("--secret-stdin", is_flag=True, help="Read a new key from the first line of standard input.")
@click.option("--clear-secret", is_flag=True, help="Remove the stored key.")
@click.option("--enable/--disable", "enabled", default=None, help="Switch the target on or off.")
@click.option("--test", "send_test", is_flag=True, help="Send a test event right after.")
@click.pass_context
def exports_edit(ctx, target_id, pairs, unset, secret, secret_stdin, clear_secret, enabled, send_test):
    """Change an export target. Settings not named keep their values; the key stays unless replaced."""
    key = _secret(secret, secret_stdin)
    if clear_secret:
        if key is not None:
            raise click.UsageError("--clear-secret removes the key; do not give a new one with it.")
        key = ""
    with client_from(ctx) as api:
        settings = None
        if pairs or unset:
            # The API takes the settings whole: start from the stored ones.
            settings = dict(api.export_target(target_id)["settings"])
            for name in unset:
                settings.pop(name, None)
            settings.update(_settings(pairs))
        t = api.export_target_update(target_id, settings=settings, secret=key, enabled=enabled)
        click.echo(f"updated {_describe(t)}")
        if send_test:
            _report(api.export_target_test(target_id))


@exports.command("test")
@click.argument("target_id", type=int)
@click.pass_context
def exports_test(ctx, target_id):
    """Send one test event with the stored settings and key; exit 1 with the service's answer if it fails."""
    with client_from(ctx) as api:
        _report(api.export_target_test(target_id))


@exports.command("delete")
@click.argument("target_id", type=int)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def exports_delete(ctx, target_id, yes):
    """Delete an export target (what it already sent stays at the service)."""
    if not yes:
        click.confirm(f"Delete export {target_id}?", abort=True)
    with client_from(ctx) as api:
        api.export_target_delete(target_id)
    click.echo(f"export {target_id} deleted")
