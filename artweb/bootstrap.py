"""What settings and the launcher both decide before Django is set up (so no Django here): the SECRET_KEY
kept in the data dir when none is configured, and which host names are this machine's own.

settings read the key file when SECRET_KEY is unset; the launcher makes it before starting anything and
passes the key to every process it starts.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import tempfile
from pathlib import Path

KEY_FILE = "secret_key"
# The names a browser on this machine uses for a server listening on loopback.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def secret_key_path(data_dir: Path) -> Path:
    return data_dir / KEY_FILE


def secret_key_load_or_create(data_dir: Path) -> str:
    """The key in data_dir/secret_key, made first if there is none (50 random URL-safe bytes, mode 0600).

    The new key is written to a temporary file (mkstemp creates it 0600, whatever the umask) and linked
    into place, so it is never readable by others, never seen half-written, and of two processes that
    start at once, the second links nothing and reads the first one's key.
    """
    path = secret_key_path(data_dir)
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=f".{KEY_FILE}-")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(50) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process made it first: use theirs
        finally:
            os.unlink(tmp)
    key = path.read_text().strip()
    if not key:
        raise ValueError(
            f"{path} is empty. Restore it from a backup, or delete it to have a new key made (export and "
            "judge secrets stored under the old key must then be entered again)."
        )
    return key


def is_loopback_host(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (bracketed or not): a name only this machine reaches."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
