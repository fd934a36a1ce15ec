"""ART's own client from PyPI, in an environment of its own, for the tests and benchmarks that drive
artweb as an ART user does (training.client_runs): `art_python("0.5.18")` is the interpreter of a virtual
environment holding `openpipe-art==0.5.18` and nothing of artweb, built once and reused.

Each version gets its own environment under .art-clients/ (ignored by git): ART 0.5.17 and 0.5.18 pin
different dependencies, and neither may leak into artweb's own environment.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from artweb.testing.stack import REPO

ROOT = Path(os.environ.get("ARTWEB_ART_CLIENTS_DIR", REPO / ".art-clients"))

# What an ART user's environment needs beside openpipe-art for ServerlessBackend (docs: the ART guide):
# - ART asks for openai>=2.14 with no upper bound, but model.openai_client() passes an httpx.Timeout, which
#   openai 3 (built on httpx2) refuses;
# - backend.train() imports wandb (its "backend" extra's pin), which logs nothing without WANDB_API_KEY;
# - model.log() (which 0.5.17's model.train() calls) writes parquet files: pyarrow and numpy.
REQUIREMENTS = ("openai>=2.14,<3", "wandb==0.25.0", "pyarrow>=15.0.0", "numpy")
# ART 0.5.17 sets its key by overriding openai's auth_headers only; from openai 2.34 the header comes from
# _auth_headers(), so with a newer openai it sends no Authorization header at all.
VERSION_REQUIREMENTS = {"0.5.17": ("openai>=2.14,<2.34",)}


def requirements(version: str) -> list[str]:
    """What `pip install` gets beside openpipe-art==version: the version's own openai pin over the common one."""
    own = VERSION_REQUIREMENTS.get(version, ())
    names = {r.split("<")[0].split(">")[0].split("=")[0] for r in own}
    return [*(r for r in REQUIREMENTS if r.split("<")[0].split(">")[0].split("=")[0] not in names), *own]


def art_python(version: str) -> Path:
    """The Python of an environment with openpipe-art==version installed (built on first use, ~1-2 min)."""
    home = ROOT / version
    python = home / "bin" / "python"
    wanted = [f"openpipe-art=={version}", *requirements(version)]
    # A marker per set of requirements: a changed set builds the environment again.
    done = home / f".installed-{hashlib.sha256(' '.join(wanted).encode()).hexdigest()[:12]}"
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes build it once
        if not done.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *wanted], check=True
            )
            done.touch()
    return python
