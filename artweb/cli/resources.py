"""Commands for what runs use and make, besides runs and exports: tokens, quotas, base models, uploads,
validation and checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from artweb.cli.base import cli, client_from, console, err_console, print_json
from artweb.client import Client
from artweb.client.bundle import zip_directory

# --- tokens ------------------------------------------------------------------------------------------


@cli.group()
def token():
    """Create or revoke your API token."""


@token.command("create")
@click.option("--username", prompt=True)
@click.option("--password", prompt=True, hide_input=True, envvar="ARTWEB_PASSWORD")
@click.pass_context
def token_create(ctx, username, password):
    """Create (or replace) your token with your username and password; prints the key."""
    click.echo(Client.token_create(ctx.obj["url"], username, password))


@token.command("revoke")
@click.pass_context
def token_revoke(ctx):
    """Revoke the token in use."""
    with client_from(ctx) as api:
        click.echo("revoked" if api.token_revoke() else "there was no token")


# --- quota -------------------------------------------------------------------------------------------


@cli.command("quota")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def quota(ctx, as_json):
    """Your quotas: what your runs use against what they may, and who set each limit."""
    with client_from(ctx) as api:
        lines = api.quota()["quotas"]
    if as_json:
        print_json(lines)
        return

    def amount(key: str, n: int | None) -> str:
        if n is None:
            return "no limit"
        if key.endswith("_seconds"):
            return f"{n / 3600:,.2f} h"
        return f"{n / (1 << 20):,.1f} MB" if key.endswith("_bytes") else f"{n:,}"

    table = Table("quota", "used", "limit", "set by")
    for line in lines:
        used = amount(line["key"], line["used"]) + (" (reached)" if line["reached"] else "")
        table.add_row(line["label"], used, amount(line["key"], line["limit"]), line["source"])
    console.print(table)


# --- base models -------------------------------------------------------------------------------------


@cli.group()
def models():
    """Base models."""


@models.command("list")
@click.pass_context
def models_list(ctx):
    """Base models you may train: the shared ones and your own."""
    with client_from(ctx) as api:
        table = Table("id", "name", "source", "max length", "shared")
        for m in api.base_models():
            table.add_row(str(m["id"]), m["name"], m["source"], str(m["max_length"]), "yes" if m["shared"] else "")
        console.print(table)


@models.command("register")
@click.argument("name")
@click.argument("source")
@click.pass_context
def models_register(ctx, name, source):
    """Register a base model by Hugging Face id."""
    with client_from(ctx) as api:
        m = api.base_model_register(name=name, source=source)
        click.echo(f"base model {m['id']}: {m['name']} ({m['source']})")


# --- uploads -----------------------------------------------------------------------------------------


@cli.group()
def upload():
    """Upload a rollout script, a reward function, a scenario file or a data attachment."""


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


@upload.command("script")
@click.argument("file", type=click.Path(exists=True))
@click.option("--name", required=True, help="Script name; uploading to an existing name adds a version.")
@click.option("--note", default="", help="Note for a new version.")
@click.pass_context
def upload_script(ctx, file, name, note):
    """Upload a rollout script (a new version if the name exists).

    FILE is a .py file, or a bundle: a folder with rollout.py at its top beside helper modules, data files
    and pure-Python wheels (zipped here, without __pycache__ and .git), or a .zip of one."""
    path = Path(file)
    with client_from(ctx) as api:
        if path.is_dir() or path.suffix.lower() == ".zip":
            try:
                bundle = path.read_bytes() if path.is_file() else zip_directory(path)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from exc
            v = api.script_bundle_upload(name, bundle, note=note)
        else:
            v = api.script_upload(name, _read(file), note=note)
        click.echo(f"rollout script {v['asset_id']} {v['name']!r} version {v['number']} ({v['sha256'][:12]})")


@upload.command("reward")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--name", required=True, help="Reward name; uploading to an existing name adds a version.")
@click.option("--note", default="", help="Note for a new version.")
@click.pass_context
def upload_reward(ctx, file, name, note):
    """Upload a reward function (a new version if the name exists)."""
    with client_from(ctx) as api:
        v = api.reward_upload(name, _read(file), note=note)
        click.echo(f"reward function {v['asset_id']} {v['name']!r} version {v['number']} ({v['kind']})")


@upload.command("scenarios")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--name", required=True)
@click.option(
    "--validation-fraction",
    default=0.2,
    show_default=True,
    type=click.FloatRange(0.0, 0.99),
    help='Share of lines without a "split" key held out for validation.',
)
@click.pass_context
def upload_scenarios(ctx, file, name, validation_fraction):
    """Upload a JSONL scenario file: one JSON object per line."""
    with client_from(ctx) as api:
        s = api.scenarios_upload(name, _read(file), validation_fraction=validation_fraction)
        click.echo(
            f"scenario set {s['id']} {s['name']!r}: {s['train_count']} train, {s['validation_count']} validation"
        )


@upload.command("attachment")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--name", default=None, help="Its name in the sandbox, /data/<name> (default: the file's name).")
@click.option("--description", default="")
@click.pass_context
def upload_attachment(ctx, file, name, description):
    """Upload a data attachment (a SQLite database, JSON, parquet …), streamed from disk; runs that list it
    read it at /data/<name>. Uploading the same file under the same name again changes nothing."""
    with client_from(ctx) as api:
        a = api.attachment_upload(file, name=name, description=description)
        click.echo(f"attachment {a['id']} {a['name']!r}: {a['size']:,} bytes at {a['path']} ({a['sha256'][:12]})")


@cli.group()
def attachments():
    """List and delete data attachments."""


@attachments.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def attachments_list(ctx, as_json):
    """Your data attachments: name, size and where runs read them."""
    with client_from(ctx) as api:
        rows = api.attachments()
    if as_json:
        print_json(rows)
        return
    table = Table("id", "name", "size", "path", "sha256")
    for a in rows:
        table.add_row(str(a["id"]), a["name"], f"{a['size']:,}", a["path"], a["sha256"][:12])
    console.print(table)


@attachments.command("delete")
@click.argument("name")
@click.pass_context
def attachments_delete(ctx, name):
    """Delete your attachment NAME (refused while a run that is not finished uses it)."""
    with client_from(ctx) as api:
        found = [a for a in api.attachments() if a["name"] == name]
        if not found:
            raise click.ClickException(f"You have no attachment named {name!r} (see `artweb attachments list`).")
        api.attachment_delete(found[0]["id"])
    click.echo(f"attachment {name!r} deleted")


@cli.command("validate")
@click.argument("kind", type=click.Choice(["script", "reward"]))
@click.argument("file", type=click.Path(exists=True))
@click.pass_context
def validate(ctx, kind, file):
    """Check a script or reward function without saving it.

    A script may be a bundle, as `upload script` takes it: a folder with rollout.py at its top, or a .zip."""
    path = Path(file)
    bundle = kind == "script" and (path.is_dir() or path.suffix.lower() == ".zip")
    if path.is_dir() and not bundle:
        raise click.BadParameter(f"{file} is a folder; a reward function is one .py file.", param_hint="FILE")
    with client_from(ctx) as api:
        if bundle:
            try:
                result = api.script_bundle_validate(path.read_bytes() if path.is_file() else path)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from exc
        else:
            text = path.read_text(encoding="utf-8")
            result = api.script_validate(text) if kind == "script" else api.reward_validate(text)
        if result["valid"]:
            click.echo("valid" + (f" ({result['kind']})" if result.get("kind") else ""))
            return
        for issue in result["issues"]:
            click.echo(f"{file}:{issue['line'] or '-'}: {issue['message']}")
        sys.exit(1)


# --- checkpoints -------------------------------------------------------------------------------------


@cli.group()
def checkpoints():
    """List, download, promote and delete checkpoints."""


@checkpoints.command("list")
@click.argument("run_id", type=int)
@click.pass_context
def checkpoints_list(ctx, run_id):
    """A run's checkpoints, newest first."""
    with client_from(ctx) as api:
        table = Table("id", "step", "state", "size", "val reward", "promoted")
        for c in api.checkpoints(run_id):
            val = "" if c["val_reward"] is None else f"{c['val_reward']:.3f}"
            table.add_row(
                str(c["id"]),
                str(c["step"]),
                c["state"],
                f"{c['size_bytes'] / 1e6:.1f} MB",
                val,
                "yes" if c["promoted"] else "",
            )
        console.print(table)


@checkpoints.command("download")
@click.argument("checkpoint_id", type=int)
@click.option("--out", required=True, type=click.Path(dir_okay=False, writable=True))
@click.pass_context
def checkpoints_download(ctx, checkpoint_id, out):
    """Save the checkpoint's adapter as a .tar.gz."""
    with (
        client_from(ctx) as api,
        Progress(TextColumn("download"), BarColumn(), MofNCompleteColumn(), console=err_console, transient=True) as bar,
    ):
        task = bar.add_task("download", total=None)
        size = api.checkpoint_download(
            checkpoint_id, out, progress=lambda done, total: bar.update(task, completed=done, total=total)
        )
    click.echo(f"{size} bytes written to {out}")


@checkpoints.command("promote")
@click.argument("checkpoint_id", type=int)
@click.pass_context
def checkpoints_promote(ctx, checkpoint_id):
    """Mark a checkpoint as its run's chosen one."""
    with client_from(ctx) as api:
        c = api.checkpoint_promote(checkpoint_id)
    click.echo(f"checkpoint {c['id']} (step {c['step']}) promoted")


@checkpoints.command("delete")
@click.argument("checkpoint_id", type=int)
@click.pass_context
def checkpoints_delete(ctx, checkpoint_id):
    """Delete a checkpoint's files (refused while its run needs them)."""
    with client_from(ctx) as api:
        c = api.checkpoint_delete(checkpoint_id)
    click.echo(f"checkpoint {c['id']} (step {c['step']}) {c['state']}")
