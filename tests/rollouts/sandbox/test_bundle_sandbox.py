"""Rollout bundles in the real jail: the bundle's modules, data files and pure-Python wheels sit beside
rollout.py in each box, a pre-started batch takes them like a cold one, and a stored bundle that was
changed behind the server's back is checked again and refused before any of it is written."""

from __future__ import annotations

import pytest

from rollouts.sandbox.bundles import BundleError, bundle_read, bundle_store
from rollouts.sandbox.prestart import prestarted
from rollouts.sandbox.rollouts import dry_run, run_rollouts
from tests.rollouts.bundle_zips import ROLLOUT, good_files, make_zip, wheel

from .conftest import NO_SERVER

WITH_WHEEL = (
    ROLLOUT.replace("from utils import greeting\n", "from utils import greeting\nfrom shout import shout\n")
    .replace("text = greeting(", "text = shout(greeting(")
    .replace("['i']])\n", "['i']]))\n")
)


@pytest.fixture
def stored(tmp_path):
    """Store a bundle made of (name, bytes) files; returns (path, its rollout.py text)."""

    def store(files: list[tuple[str, bytes]]):
        bundle = bundle_read(make_zip(files))
        return bundle_store(bundle, tmp_path / "bundles"), bundle.rollout_bytes.decode()

    return store


@pytest.mark.slow
def test_a_dry_run_of_a_bundle_imports_its_helpers_reads_its_data_and_loads_its_wheel(stored):
    files = [("rollout.py", WITH_WHEEL.encode()), *good_files()[1:]]
    files.append(("wheels/shout-1.0-py3-none-any.whl", wheel("shout", "def shout(s):\n    return s.upper()\n")))
    path, script = stored(files)
    result = dry_run(
        script=script,
        reward=None,
        scenarios=[{"i": 0}, {"i": 1}],
        base_url=NO_SERVER,
        model_name="none",
        timeout_s=60,
        bundle=path,
    )
    assert result["errors"] == []
    assert [t["metadata"]["text"] for t in result["trajectories"]] == ["HELLO WORLD", "HELLO THERE"]


@pytest.mark.slow
def test_a_prestarted_batch_gets_the_bundles_files_too(request_for, stored):
    prestarted.discard()
    path, script = stored(good_files())
    try:
        for step in (1, 2):  # the second batch takes the jail the first one pre-started
            request = request_for(
                script,
                scenarios=[{"i": 1}],
                group_size=1,
                sandboxes=1,
                step=step,
                warm_key="run-bundle",
                prestart_next=step == 1,
                bundle=path,
            )
            if step == 2:
                assert prestarted.keys() == ["run-bundle"]
            (group,) = run_rollouts(request)
            assert [t["error"] for t in group.trajectories] == [None]
            assert group.trajectories[0]["metadata"]["text"] == "hello there"
    finally:
        prestarted.discard()


def test_a_stored_bundle_changed_on_disk_is_refused_before_the_batch_starts(request_for, stored):
    path, script = stored(good_files())
    path.write_bytes(make_zip([*good_files(), ("../../escape.py", b"x = 1\n")]))
    with pytest.raises(BundleError, match="climbs out"):
        run_rollouts(request_for(script, scenarios=[{"i": 1}], group_size=1, sandboxes=1, bundle=path))
    assert not (path.parent.parent / "escape.py").exists()
