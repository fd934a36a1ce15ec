"""What every command shares: the top-level group with the server and token options, the client,
and the consoles."""

from __future__ import annotations

import json

import click
from rich.console import Console

from artweb.client import Client

console = Console()
err_console = Console(stderr=True)


@click.group()
@click.option(
    "--url",
    envvar="ARTWEB_URL",
    default="http://127.0.0.1:8000",
    show_default=True,
    help="Server address (env ARTWEB_URL).",
)
@click.option("--token", envvar="ARTWEB_TOKEN", default=None, help="API token (env ARTWEB_TOKEN).")
@click.pass_context
def cli(ctx, url, token):
    """Drive artweb from the terminal: uploads, runs, metrics, trajectories, checkpoints, exports."""
    ctx.obj = {"url": url, "token": token}


def client_from(ctx) -> Client:
    if not ctx.obj["token"]:
        raise click.UsageError("No API token: pass --token or set ARTWEB_TOKEN (get one with 'artweb token create').")
    return Client(ctx.obj["url"], ctx.obj["token"])


def print_json(data) -> None:
    console.print_json(json.dumps(data))
