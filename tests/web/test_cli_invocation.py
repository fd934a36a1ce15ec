"""The `artweb` command after `make run`: it lives in the virtual environment's bin directory, on no one's
PATH, so the launcher's banner and the docs give the two ways that work from a shell, and both do."""

import os
import subprocess
import sys
from pathlib import Path

from artweb.launcher import cli_hint

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the environment `make run` installs into (.venv/bin there)


def test_the_documented_invocations_work_from_a_shell_without_the_environment_on_its_path():
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != BIN)
    shell = (
        '"$BIN/artweb" --help | head -n 1 && '  # the exact path the banner prints
        '. "$BIN/activate" && command -v artweb && artweb --help | head -n 1'  # `source .venv/bin/activate`
    )
    done = subprocess.run(
        ["bash", "-c", shell],
        env={**os.environ, "PATH": path, "BIN": str(BIN)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    first, found, again = done.stdout.splitlines()
    assert first == again == "Usage: artweb [OPTIONS] COMMAND [ARGS]..."
    assert Path(found) == BIN / "artweb"


def test_the_banner_says_the_exact_command(tmp_path):
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "activate").touch()
    line = cli_hint(python=str(tmp_path / ".venv" / "bin" / "python"), cwd=str(tmp_path))
    assert line == "Command line: .venv/bin/artweb --help, or `source .venv/bin/activate` first to type just `artweb`."
    # The banner the install page shows is the launcher's.
    assert line in (ROOT / "docs" / "start" / "install.md").read_text()
    # Outside a virtual environment there is nothing to activate: the path alone.
    assert cli_hint(python="/opt/tools/bin/python", cwd=str(tmp_path)) == "Command line: /opt/tools/bin/artweb --help."


def test_the_docs_say_how_to_reach_the_command():
    for page in ("README.md", "docs/reference/cli.md", "docs/start/install.md"):
        text = " ".join((ROOT / page).read_text().split())  # line breaks inside a sentence do not matter
        assert "source .venv/bin/activate" in text, page
    assert "`.venv/bin/artweb`" in (ROOT / "docs" / "reference" / "cli.md").read_text()
