"""A rollout bundle from a folder: its files zipped in memory, for a script upload.

The server checks every bundle (rollouts.sandbox.bundles); this side only leaves out what never belongs in one
(byte code, version control and editor folders) and refuses links, which the server refuses too, with a
message naming the file here rather than an entry in an archive.
"""

from __future__ import annotations

import io
import os
import stat
import zipfile
from pathlib import Path

SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # one date on every entry: the same folder zips to the same bytes


def zip_directory(folder: str | Path) -> bytes:
    """The folder's files as a zip, paths relative to it; ValueError for a link or without rollout.py."""
    root = Path(folder)
    if not (root / "rollout.py").is_file():
        raise ValueError(f"{root} has no rollout.py; a bundle's folder holds the rollout script at its top.")
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for d in dirnames:
            if (Path(dirpath) / d).is_symlink():
                raise ValueError(f"{Path(dirpath) / d} is a link; bundles hold files only. Copy what it points to.")
        paths += [Path(dirpath) / f for f in filenames if not f.endswith(SKIPPED_SUFFIXES)]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(paths):
            mode = path.lstat().st_mode
            if not stat.S_ISREG(mode):
                raise ValueError(f"{path} is a link or not a regular file; bundles hold files only. Copy it in.")
            info = zipfile.ZipInfo(path.relative_to(root).as_posix(), date_time=ZIP_EPOCH)
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    return out.getvalue()
