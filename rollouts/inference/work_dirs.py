"""Inference servers' work directories (merged copies of weights), and the removal of those left behind.

A work directory is named after the process that made it (pid and start time: a pid is reused, the pair is
not), so that one left behind by a process that died without stopping its server can be told from one in
use, on a machine where several workers share the temporary directory.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

logger = logging.getLogger("rollouts.inference.inference_server")

WORK_DIR_PREFIX = "artweb-inference-"
_WORK_DIR_NAME = re.compile(re.escape(WORK_DIR_PREFIX) + r"(\d+)-(\d+)-")


def _process_start(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat); None when no
    such process exists."""
    try:
        line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return line[line.rindex(")") + 2 :].split()[19]  # after the name, which may hold spaces: fields 3 on


def work_dir_create(root: str | os.PathLike | None = None) -> Path:
    """A new work directory under root (the temporary directory by default), owned by this process."""
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"{WORK_DIR_PREFIX}{pid}-{_process_start(pid)}-", dir=root))


def work_dirs_remove_orphaned(root: str | os.PathLike | None = None) -> list[Path]:
    """Remove the work directories under root whose owner process has exited; returns them. A directory
    of a live process, one named otherwise, a link, or one of another user is left alone."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{WORK_DIR_PREFIX}*"):
        match = _WORK_DIR_NAME.match(path.name)
        try:
            info = path.lstat()
        except OSError:
            continue
        if match is None or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        pid, started = match.groups()
        if _process_start(int(pid)) == started:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
        logger.info("removed %s, left by process %s, which has exited", path, pid)
    return removed
