"""Data attachments: files a user uploads once (a SQLite database, JSON, parquet) that a run's rollouts
read inside the jail, read-only, at DATA_INSIDE/<name>.

Stored once per content: DATA_DIR/attachments/<sha256>, written by streaming the upload through the
hash (a 2 GiB file is never held in memory), mode 0444 and owned by the worker, so that the sandbox's
uid can read it and nothing but the worker can change it. The jail binds each of a run's files on its
own, read-only (rollouts.sandbox.mounts.stage_files); the directory that holds everyone's files is
never mounted, so a batch sees only its run's.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import BinaryIO

DATA_INSIDE = "/data"  # where the jail shows a run's attachments
CHUNK = 1 << 20

# A name is the file's name inside the jail: one path component, no hidden file, no shell surprises.
NAME_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_HELP = "1 to 100 characters: letters, digits, '.', '_' and '-', starting with a letter or a digit (e.g. mail.db)"


class AttachmentTooLarge(ValueError):
    """The upload went past the size limit while it was being stored."""


def attachment_name_problem(name: str) -> str | None:
    """What is wrong with `name` as an attachment's file name, or None when it is fine."""
    if not NAME_RULE.fullmatch(name or ""):
        return f"{name!r} is not a file name an attachment can have: {NAME_HELP}."
    if ".." in name:
        return f"{name!r} has '..' in it; pick a name without it."
    return None


def attachment_path(directory: Path, sha256: str) -> Path:
    """The stored file of a content hash."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"{sha256!r} is not a SHA-256 hex digest")
    return directory / sha256


def attachment_receive(source: BinaryIO, directory: Path, *, max_bytes: int) -> tuple[Path, str, int]:
    """Copy `source` to a new temporary file in `directory`, hashing it on the way: (that file, sha256,
    size). Raises AttachmentTooLarge, the partial file removed, as soon as more than max_bytes arrived.
    The caller moves the file into place (attachment_keep) or removes it."""
    directory.mkdir(parents=True, exist_ok=True)
    incoming = directory / f".incoming-{uuid.uuid4().hex}"
    digest, size = hashlib.sha256(), 0
    try:
        with open(incoming, "xb") as out:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise AttachmentTooLarge(f"more than {max_bytes} bytes")
                digest.update(chunk)
                out.write(chunk)
    except BaseException:
        incoming.unlink(missing_ok=True)
        raise
    return incoming, digest.hexdigest(), size


def attachment_keep(incoming: Path, directory: Path, sha256: str) -> Path:
    """Move a received file to its place by hash, read-only for everyone; an identical file already
    there is kept and the received one dropped."""
    target = attachment_path(directory, sha256)
    if target.exists():
        incoming.unlink(missing_ok=True)
    else:
        incoming.chmod(0o444)
        os.replace(incoming, target)
    return target
