"""`artweb upload attachment`, `artweb attachments list` and `delete` against a live ASGI server on the test
database (test_cli's server): the file goes through the upload route streamed, and lands stored by its hash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rollouts.models import DataAttachment
from tests.cli import test_cli
from tests.cli.test_cli import PASSWORD, Cli

server_env, server, alice_login = test_cli.server_env, test_cli.server, test_cli.alice_login  # its fixtures


def test_it_uploads_lists_and_deletes_an_attachment(server, server_env, alice_login, tmp_path):
    db = tmp_path / "inbox-2024.db"
    db.write_bytes(b"SQLite format 3\0" + bytes(range(256)) * 4000)  # ~1 MB, several chunks
    cli = Cli(server.extra["url"])
    cli.token = cli("token", "create", "--username", "alice", "--password", PASSWORD).stdout.strip()

    out = cli("upload", "attachment", str(db), "--name", "mail.db").stdout
    sha = hashlib.sha256(db.read_bytes()).hexdigest()
    assert "'mail.db'" in out and "/data/mail.db" in out
    assert Path(server_env["ARTWEB_DATA_DIR"], "attachments", sha).read_bytes() == db.read_bytes()
    assert cli("upload", "attachment", str(db), "--name", "mail.db").stdout == out  # the same: nothing new
    refused = cli("upload", "attachment", str(tmp_path / "inbox-2024.db"), "--name", "../x", ok=False)
    assert refused.returncode != 0 and "not a file name" in refused.stderr

    rows = json.loads(cli("attachments", "list", "--json").stdout)
    assert [(r["name"], r["sha256"]) for r in rows] == [("mail.db", sha)]
    assert cli("attachments", "delete", "mail.db").stdout.strip() == "attachment 'mail.db' deleted"
    assert not DataAttachment.objects.exists()
    missing = cli("attachments", "delete", "mail.db", ok=False)
    assert missing.returncode != 0 and "no attachment named 'mail.db'" in missing.stderr
