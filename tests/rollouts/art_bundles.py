"""ART's own examples, 2048 and Temporal Clue, as the bundles a person would upload.

The examples are read from ART's source distribution on PyPI (`openpipe-art`, whose sdist ships its
examples/ folder), downloaded once and kept in data/cache/: the project holds none of ART's code. A bundle
is the example's files as ART wrote them, beside an artweb `rollout.py` (written here) that calls the
example's rollout; the only change to ART's files is the import of 2048's helper module, which sits in the
bundle's art_2048/ folder (ART's `rollout.py` would otherwise shadow the bundle's entry point)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ART_SDIST = "openpipe-art==0.5.10"  # the newest sdist that ships examples/ (0.5.11 and later leave them out)
CACHE = Path(__file__).resolve().parents[2] / "data" / "cache"

# Each example: its files in the sdist's examples/ folder -> their place in the bundle.
FILES = {
    "2048": {"2048/rollout.py": "art_2048/rollout.py", "2048/utils.py": "art_2048/utils.py"},
    "temporal_clue": {
        "temporal_clue/temporal-clue.py": "temporal_clue/temporal-clue.py",
        "data/temporal-clue/puzzles.json": "data/temporal-clue/puzzles.json",
    },
}
IMPORT_CHANGES = {"art_2048/rollout.py": ("from utils import", "from art_2048.utils import")}

# artweb's entry points. ART calls its examples' rollouts from its own training loop, with its own arguments;
# artweb calls `rollout(model, scenario)`.
ENTRY = {
    "2048": '''"""ART's 2048 example (art_2048/) as an artweb rollout: one game per scenario; ART's rollout sets the
reward itself."""

import art
from art_2048.rollout import rollout as play_2048


async def rollout(model: art.Model, scenario) -> art.Trajectory:
    return await play_2048(model, await model.get_step(), bool(scenario.get("is_validation", False)))
''',
    "temporal_clue": '''"""ART's Temporal Clue example (temporal_clue/temporal-clue.py) as an artweb rollout. Its file name is
not a module name, so it is loaded from its path; each scenario is one of its puzzles."""

import importlib.util
from pathlib import Path

import art

_spec = importlib.util.spec_from_file_location(
    "temporal_clue", Path(__file__).parent / "temporal_clue" / "temporal-clue.py"
)
temporal_clue = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(temporal_clue)


async def rollout(model: art.Model, scenario) -> art.Trajectory:
    return await temporal_clue.rollout(model, scenario)
''',
}


@pytest.fixture(scope="session")
def art_sdist() -> Path:
    """ART's source distribution, from data/cache/ or downloaded there from PyPI."""
    name, version = ART_SDIST.split("==")
    cached = CACHE / f"{name.replace('-', '_')}-{version}.tar.gz"
    if cached.exists():
        return cached
    CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "-q", "-d", str(CACHE), ART_SDIST],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0 or not cached.exists():
        pytest.fail(f"`pip download {ART_SDIST}` failed (ART's examples come from its sdist): {done.stderr[-2000:]}")
    return cached


def _member(sdist: tarfile.TarFile, path: str) -> bytes:
    top = sdist.getnames()[0].split("/")[0]
    handle = sdist.extractfile(f"{top}/examples/{path}")
    assert handle is not None, f"{path} is not a file in {top}"
    return handle.read()


def bundle_folder(example: str, into: Path, sdist: Path) -> Path:
    """The example's bundle folder under `into`: ART's files from the sdist and artweb's rollout.py."""
    folder = into / example
    with tarfile.open(sdist) as tar:
        for source, dest in FILES[example].items():
            data = _member(tar, source)
            if dest in IMPORT_CHANGES:
                old, new = IMPORT_CHANGES[dest]
                assert data.count(old.encode()) == 1, f"{source}: expected one `{old}`"
                data = data.replace(old.encode(), new.encode())
            (folder / dest).parent.mkdir(parents=True, exist_ok=True)
            (folder / dest).write_bytes(data)
    (folder / "rollout.py").write_text(ENTRY[example])
    return folder


def bundle_files(folder: Path) -> list[tuple[str, bytes]]:
    return [(p.relative_to(folder).as_posix(), p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()]


def scenarios(example: str, folder: Path, count: int = 4) -> list[dict]:
    """2048: one game per scenario (the example draws its own board). Temporal Clue: its `count` shortest
    puzzles (the default model's context holds those; the longest run to 3,000 tokens)."""
    if example == "2048":
        return [{"game": n} for n in range(1, count + 1)]
    puzzles = json.loads((folder / "data" / "temporal-clue" / "puzzles.json").read_text())
    return sorted(puzzles, key=lambda p: len(p["prompt"]))[:count]
