"""Create a benchmark's PostgreSQL database when it does not exist yet.

python -m bench.db [DATABASE_URL]      # default: the DATABASE_URL environment variable
"""

from __future__ import annotations

import os
import sys
from urllib.parse import urlparse


def ensure_database(database_url: str) -> str:
    """Create the database named in database_url unless it exists; return its name."""
    import psycopg

    url = urlparse(database_url)
    name = url.path.lstrip("/")
    if not name:
        raise SystemExit(f"{database_url!r} names no database; add one, e.g. .../artweb")
    with psycopg.connect(url._replace(path="/postgres").geturl(), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return name


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DATABASE_URL", "")
    if not target:
        raise SystemExit("give a database URL, or set DATABASE_URL")
    print(f"database {ensure_database(target)} ready")
