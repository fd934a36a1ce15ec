"""Rollout bundles: hostile archives refused with a message naming the entry, a good one normalised and
stored by its content, and the upload paths (service, REST API, web form) that keep a version of it."""

from __future__ import annotations

import io
import stat
import warnings
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from artweb.errors import ApplicationError
from rollouts import services
from rollouts.models import RolloutScriptVersion
from rollouts.sandbox.bundles import BundleError, BundleLimits, bundle_read, bundle_store, bundle_write
from rollouts.selectors import script_version_bundle, script_version_sources
from tests.api.conftest import token_client
from tests.rollouts.bundle_zips import ROLLOUT, good_files, lying_sizes, make_zip, symlink_entry, wheel


def refused(data: bytes, *needles: str, limits: BundleLimits | None = None) -> str:
    with pytest.raises(BundleError) as caught:
        bundle_read(data, limits)
    message = str(caught.value)
    for needle in needles:
        assert needle in message, message
    return message


# --- hostile archives ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("../evil.py", "climbs out of the bundle"),
        ("helpers/../../evil.py", "climbs out of the bundle"),
        ("/etc/cron.d/evil", "is an absolute path"),
        ("C:/evil.py", "is an absolute path"),
        ("helpers\\..\\evil.py", "has a backslash"),
    ],
)
def test_it_refuses_entries_that_leave_the_bundle(name, needle):
    data = make_zip([*good_files(), (name, b"x = 1\n")])
    assert name in zipfile.ZipFile(io.BytesIO(data)).namelist()  # the archive holds the name as given
    message = refused(data, needle)
    assert repr(name) in message  # the refusal names the entry


def test_it_refuses_a_symlink_entry():
    refused(make_zip([*good_files(), symlink_entry("passwd", "/etc/passwd")]), "'passwd'", "symbolic link")


def test_it_refuses_a_special_file_entry():
    fifo = zipfile.ZipInfo("pipe")
    fifo.external_attr = (stat.S_IFIFO | 0o644) << 16
    refused(make_zip([*good_files(), (fifo, b"")]), "'pipe'", "not a regular file")


def test_it_refuses_an_entry_that_expands_like_a_zip_bomb():
    data = make_zip([*good_files(), ("zeros.bin", bytes(8 << 20))])
    assert len(data) < 100_000  # 8 MiB of zeros compress to a few KiB
    refused(data, "'zeros.bin'", "zip bomb")


def test_it_refuses_an_entry_whose_header_understates_its_size():
    data = lying_sizes(make_zip([*good_files(), ("zeros.bin", bytes(4 << 20))]), "zeros.bin", 100)
    refused(data, "'zeros.bin'", "lies about its sizes")


def test_it_refuses_a_bundle_past_its_size_limit_counting_every_file():
    limits = BundleLimits(max_bytes=1 << 20)
    files = [*good_files(), ("a.bin", bytes(600_000)), ("b.bin", bytes(600_000))]
    refused(make_zip(files), "'b.bin'", f"{1 << 20} byte limit", limits=limits)


def test_it_refuses_too_many_files():
    files = [*good_files(), *((f"data/{i}.txt", b"x") for i in range(BundleLimits().max_files))]
    refused(make_zip(files), "more than 500 files")


def test_it_refuses_a_wheel_that_is_not_pure_python():
    name = "fastlib-1.0-cp311-cp311-manylinux_2_17_x86_64.whl"
    refused(make_zip([*good_files(), (name, wheel("fastlib", "x = 1\n"))]), repr(name), "pure-Python")


def test_it_refuses_a_bundle_without_rollout_py():
    refused(make_zip([("utils.py", b"x = 1\n")]), "no rollout.py")


def test_it_refuses_duplicates_reserved_names_and_file_folder_clashes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate it is asked to write
        twice = make_zip([*good_files(), ("utils.py", b"y = 2\n")])
    refused(twice, "'utils.py'", "appears twice")
    refused(make_zip([*good_files(), ("reward.py", b"")]), "'reward.py'", "the sandbox uses itself")
    refused(make_zip([*good_files(), ("utils.py/inner.py", b"")]), "'utils.py'", "both a file and a folder")


def test_it_refuses_what_is_not_a_zip():
    refused(b"PK\x03\x04 not really", "not a readable zip")


# --- a good bundle -------------------------------------------------------------------------------------


def test_it_strips_one_top_folder_drops_byte_code_and_hashes_by_content():
    pure = "helper-1.0-py3-none-any.whl"
    files = [*good_files(), (pure, wheel("helper", "X = 1\n"))]
    nested = make_zip(
        [(f"agent/{n}", d) for n, d in reversed(files)] + [("agent/__pycache__/utils.cpython-311.pyc", b"\0")]
    )
    bundle = bundle_read(nested)
    assert list(bundle.files) == sorted(n for n, _ in files)
    assert bundle.wheels == [pure]
    assert bundle.sha256 == bundle_read(make_zip(files)).sha256  # order and top folder do not matter
    assert bundle_read(bundle.to_zip()).files == bundle.files


def test_it_stores_a_bundle_once_readable_by_its_owner_only(tmp_path):
    bundle = bundle_read(make_zip(good_files()))
    path = bundle_store(bundle, tmp_path / "bundles")
    assert path.name == f"{bundle.sha256}.zip"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert bundle_store(bundle, tmp_path / "bundles") == path
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_it_never_writes_through_a_link_in_the_destination(tmp_path):
    bundle = bundle_read(make_zip(good_files()))
    outside = tmp_path / "outside"
    outside.mkdir()
    box = tmp_path / "box"
    box.mkdir()
    (box / "data").symlink_to(outside)
    with pytest.raises(FileExistsError):
        bundle_write(bundle, box)
    assert list(outside.iterdir()) == []


# --- upload paths ---------------------------------------------------------------------------------------


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    return tmp_path


@pytest.mark.django_db
def test_the_service_keeps_a_bundle_version_with_its_rollout_py(alice, data_dir):
    version = services.script_create(owner=alice, name="agent", bundle=make_zip(good_files()))
    assert version.content == ROLLOUT
    assert version.bundle_sha256 == version.sha256 == bundle_read(make_zip(good_files())).sha256
    stored = script_version_bundle(version)
    assert stored == data_dir / "bundles" / f"{version.sha256}.zip" and stored.is_file()
    again = services.script_version_create(script=version.asset, bundle=make_zip(list(reversed(good_files()))))
    assert again.id == version.id  # the same files are the same version


@pytest.mark.django_db
def test_the_service_refuses_a_hostile_bundle_and_saves_nothing(alice, data_dir):
    with pytest.raises(ApplicationError, match="climbs out"):
        services.script_create(owner=alice, name="agent", bundle=make_zip([*good_files(), ("../x.py", b"")]))
    broken = [("rollout.py", b"def rollout(:\n"), *good_files()[1:]]
    with pytest.raises(ApplicationError, match="rollout.py in the bundle"):
        services.script_create(owner=alice, name="agent", bundle=make_zip(broken))
    assert not RolloutScriptVersion.objects.exists()
    assert not (data_dir / "bundles").exists()


@pytest.mark.django_db
def test_the_api_takes_a_zip_upload_as_a_bundle_version(alice, data_dir):
    api = token_client(alice)
    upload = SimpleUploadedFile("agent.zip", make_zip(good_files()), "application/zip")
    response = api.post("/api/v1/scripts/create/", {"name": "agent", "file": upload}, format="multipart")
    assert response.status_code == 201, response.json()
    created = response.json()
    detail = api.get(f"/api/v1/scripts/{created['asset_id']}/versions/1/").json()
    assert detail["content"] == ROLLOUT and detail["bundle_sha256"] == created["sha256"]

    changed = [*good_files(), ("notes.txt", b"v2")]
    response = api.post(
        f"/api/v1/scripts/{created['asset_id']}/versions/create/",
        {"note": "notes", "file": SimpleUploadedFile("agent.zip", make_zip(changed), "application/zip")},
        format="multipart",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["number"] == 2

    bad = SimpleUploadedFile("evil.zip", make_zip([*good_files(), symlink_entry("key", "/root/.ssh/id_rsa")]))
    response = api.post("/api/v1/scripts/create/", {"name": "evil", "file": bad}, format="multipart")
    assert response.status_code == 400
    assert "'key'" in response.json()["message"] and "symbolic link" in response.json()["message"]


@pytest.mark.django_db
def test_the_web_form_takes_a_zip_bundle(client, alice, data_dir):
    client.force_login(alice)
    upload = SimpleUploadedFile("agent.zip", make_zip(good_files()), "application/zip")
    response = client.post("/scripts/new/", {"name": "agent", "file": upload})
    assert response.status_code == 302, response.content[:2000]
    version = RolloutScriptVersion.objects.get(asset__name="agent")
    assert version.bundle_sha256 and version.content == ROLLOUT


@pytest.mark.django_db
def test_the_script_page_lists_a_bundles_files_and_shows_its_text_ones(client, alice, data_dir):
    client.force_login(alice)
    files = [*good_files(), ("blob.bin", b"\xff\xfe\x00binary")]
    upload = SimpleUploadedFile("agent.zip", make_zip(files), "application/zip")
    assert client.post("/scripts/new/", {"name": "agent", "file": upload}).status_code == 302
    version = RolloutScriptVersion.objects.get(asset__name="agent")
    page = client.get(f"/scripts/{version.asset_id}/").content.decode()
    assert "Files beside rollout.py in v1" in page
    assert "utils.py" in page and "data/words.json" in page and "blob.bin" in page
    assert "return &#x27;hello &#x27; + word" not in page  # a file's text only when asked for
    shown = client.get(f"/scripts/{version.asset_id}/?v=1&file=utils.py").content.decode()
    assert "return &#x27;hello &#x27; + word" in shown
    assert 'href="?v=1&amp;file=blob.bin' not in shown  # binary: listed, never shown as text
    # A stored bundle that changed on disk is named as refused, as the batch would refuse it.
    stored = data_dir / "bundles" / f"{version.bundle_sha256}.zip"
    stored.write_bytes(make_zip([("rollout.py", ROLLOUT.encode()), ("../x.py", b"")]))
    broken = client.get(f"/scripts/{version.asset_id}/").content.decode()
    assert "The stored bundle is refused" in broken and "climbs out" in broken


@pytest.mark.django_db
def test_the_api_validates_a_bundle_without_saving_it(alice, data_dir):
    api = token_client(alice)

    def validate(files):
        upload = SimpleUploadedFile("agent.zip", make_zip(files), "application/zip")
        response = api.post("/api/v1/scripts/validate/", {"file": upload}, format="multipart")
        assert response.status_code == 200, response.json()
        return response.json()

    assert validate(good_files()) == {"valid": True, "issues": []}
    traversal = validate([*good_files(), ("../x.py", b"")])
    assert not traversal["valid"] and "climbs out" in traversal["issues"][0]["message"]
    broken = validate([("rollout.py", b"import art\n"), *good_files()[1:]])
    assert not broken["valid"] and broken["issues"][0]["message"].startswith("rollout.py: ")
    assert not RolloutScriptVersion.objects.exists() and not (data_dir / "bundles").exists()


@pytest.mark.django_db
def test_a_bundles_helper_modules_count_when_looking_for_art_rewards(alice, data_dir):
    """Whether a batch admits the RULER judge is a text test of the run's code: a bundle's helper module
    that calls art.rewards.ruler_score_group must be read too, not only its rollout.py."""
    files = [*good_files(), ("judging.py", b"import art\nscore = art.rewards.ruler_score_group\n")]
    version = services.script_create(owner=alice, name="agent", bundle=make_zip(files))
    sources = script_version_sources(version)
    assert sources[0] == version.content and "ruler" not in version.content
    assert any("ruler_score_group" in s for s in sources[1:])
    plain = services.script_create(owner=alice, name="plain", content="async def rollout(model, scenario): ...\n")
    assert script_version_sources(plain) == [plain.content]
