"""`artweb upload script FOLDER`: a rollout bundle zipped by the CLI and stored by a live ASGI server on
the test database (test_cli's server)."""

from __future__ import annotations

import zipfile

from rollouts.models import RolloutScriptVersion
from tests.cli import test_cli
from tests.cli.test_cli import PASSWORD, Cli
from tests.rollouts.bundle_zips import ROLLOUT, good_files, make_zip

server_env, server, alice_login = test_cli.server_env, test_cli.server, test_cli.alice_login  # its fixtures


def folder_of(root, files) -> None:
    for name, data in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def test_it_uploads_a_folder_as_a_bundle_and_refuses_one_with_a_link(server, server_env, alice_login, tmp_path):
    agent = tmp_path / "agent"
    folder_of(agent, [*good_files(), ("__pycache__/utils.cpython-311.pyc", b"\0"), (".git/HEAD", b"ref")])
    cli = Cli(server.extra["url"])
    cli.token = cli("token", "create", "--username", "alice", "--password", PASSWORD).stdout.strip()

    out = cli("upload", "script", str(agent), "--name", "agent").stdout
    assert "version 1" in out
    version = RolloutScriptVersion.objects.get(asset__name="agent")
    assert version.content == ROLLOUT and version.bundle_sha256
    path = f"{server_env['ARTWEB_DATA_DIR']}/bundles/{version.bundle_sha256}.zip"
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == sorted(name for name, _ in good_files())  # no byte code, no .git

    (agent / "secret").symlink_to("/etc/hostname")
    refused = cli("upload", "script", str(agent), "--name", "agent", ok=False)
    assert refused.returncode != 0 and "secret" in refused.stderr and "link" in refused.stderr
    assert RolloutScriptVersion.objects.filter(asset__name="agent").count() == 1


def test_it_validates_a_folder_or_zip_bundle_without_saving_it(server, server_env, alice_login, tmp_path):
    agent = tmp_path / "agent"
    folder_of(agent, good_files())
    cli = Cli(server.extra["url"])
    cli.token = cli("token", "create", "--username", "alice", "--password", PASSWORD).stdout.strip()

    assert cli("validate", "script", str(agent)).stdout.strip() == "valid"
    (agent / "rollout.py").write_text("import art\n")  # no rollout function
    broken = cli("validate", "script", str(agent), ok=False)
    assert broken.returncode == 1 and f"{agent}:" in broken.stdout and "rollout.py: " in broken.stdout
    archive = tmp_path / "agent.zip"
    archive.write_bytes(make_zip([*good_files(), ("../escape.py", b"")]))
    climbing = cli("validate", "script", str(archive), ok=False)
    assert climbing.returncode == 1 and "climbs out" in climbing.stdout
    refused = cli("validate", "reward", str(agent), ok=False)
    assert refused.returncode == 2 and "a reward function is one .py file" in refused.stderr
    assert not RolloutScriptVersion.objects.exists()
