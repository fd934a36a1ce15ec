"""`artweb`: the command line for the REST API.

The server and token come from --url/--token or ARTWEB_URL/ARTWEB_TOKEN. Examples:

    artweb token create --username alice            # prints a key: export ARTWEB_TOKEN=...
    artweb upload script rollout.py --name my-agent
    artweb upload reward reward.py --name exact-match
    artweb upload scenarios questions.jsonl --name questions
    artweb runs start --config run.yaml --watch
    artweb runs export 12 --out run12.jsonl
    artweb checkpoints download 40 --out adapter.tar.gz
    artweb exports create wandb --set project=my-agent --secret --test
    artweb chat run-12@best "Write one sentence about the sea."
    artweb diff start SmolLM2-135M-Instruct run-12@best --scenarios questions --reward exact-match
"""

from __future__ import annotations

import sys

import httpx

from artweb.cli import exports, resources, runs, serving  # noqa: F401  (importing them registers their commands)
from artweb.cli.base import cli, err_console
from artweb.client import ApiError

__all__ = ["cli", "main"]


def main() -> None:
    try:
        cli(standalone_mode=True)
    except ApiError as exc:
        err_console.print(f"[red]Error ({exc.status}):[/red] {exc.message}")
        for field, messages in exc.field_errors.items():
            err_console.print(f"  {field}: {'; '.join(messages)}")
        sys.exit(1)
    except httpx.TransportError as exc:
        err_console.print(f"[red]Cannot reach the server:[/red] {exc}. Check --url / ARTWEB_URL.")
        sys.exit(2)
