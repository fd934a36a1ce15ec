"""The libraries a rollout may import without bringing them: those ART's examples import, installed for the
sandbox's interpreter by the `sandbox` extra (docs/security/sandbox.md#libraries), imported inside the real
jail, where a module that needs the network, a writable home or a file outside the jail's view at import
time would fail."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from rollouts.sandbox.rollouts import dry_run

from .conftest import NO_SERVER

ROOT = Path(__file__).resolve().parents[3]

# Import name → distribution: the documented set (docs/security/sandbox.md#libraries).
LIBRARIES = {
    "requests": "requests",
    "pydantic": "pydantic",
    "tenacity": "tenacity",
    "langchain_core": "langchain-core",
    "mcp": "mcp",
    "litellm": "litellm",
    "openai": "openai",
    "dotenv": "python-dotenv",
    "weave": "weave",
    "wandb": "wandb",
}

IMPORTS = """
import importlib
import traceback

import art


async def rollout(model, scenario):
    missing = {}
    for name in scenario["modules"]:
        try:
            module = importlib.import_module(name)
        except BaseException as exc:
            missing[name] = traceback.format_exception_only(exc)[-1].strip()
            continue
        if "/guest_fallbacks/" in (getattr(module, "__file__", None) or ""):
            missing[name] = "only the sandbox's stand-in was found, not the library"
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "imports"}], reward=1.0,
                          metadata={"missing": missing})
"""


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_it_declares_every_library_of_the_set_for_the_install():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"]) | _names(project["optional-dependencies"]["sandbox"])
    assert set(LIBRARIES.values()) - declared == set()
    documented = (ROOT / "docs" / "security" / "sandbox.md").read_text()
    assert [d for d in LIBRARIES.values() if f"`{d}`" not in documented] == []


@pytest.mark.slow
def test_it_imports_every_library_of_the_set_inside_the_jail():
    result = dry_run(
        script=IMPORTS,
        reward=None,
        scenarios=[{"modules": list(LIBRARIES)}],
        base_url=NO_SERVER,
        model_name="none",
        timeout_s=180,
    )
    assert result["errors"] == [], result["errors"]
    missing = result["trajectories"][0]["metadata"]["missing"]
    assert missing == {}, "not importable in the sandbox: " + "; ".join(
        f"{name} ({LIBRARIES[name]}): {why}" for name, why in missing.items()
    )
