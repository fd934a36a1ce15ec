"""Re-scores bind the run's data attachments at /data/<name>, as its steps did: a reward that reads one
scores from it in the real jail. An attachment deleted since the run is refused, or fails the re-score,
naming it."""

from __future__ import annotations

import io
import json

import pytest

from artweb.errors import ApplicationError
from rollouts.attachments import attachment_create
from rollouts.models import DataAttachment
from tests.analytics.test_rescores import new_reward, seed_group, seed_run
from training.analytics.rescores import rescore_create, rescore_execute
from training.models import Rescore, RescoreScore

pytestmark = pytest.mark.django_db

# Scores each answer by the table in the attachment: right only if the reward read /data/scores.json.
TABLE_REWARD = """import json


def reward(trajectory, scenario):
    with open("/data/scores.json") as f:
        table = json.load(f)
    return table[trajectory.messages_and_choices[-1].message.content]
"""
TABLE = {"bb": 0.25, "a": 0.75, "ccc": 0.5}


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr("training.tasks.rescore_execute_task.apply_async", lambda args, kwargs: None)


@pytest.fixture
def table_run(alice):
    """A finished run whose config names alice's scores.json, with one stored group of three answers."""
    attachment_create(owner=alice, source=io.BytesIO(json.dumps(TABLE).encode()), name="scores.json")
    run = seed_run(alice, steps_done=1, config={"attachments": ["scores.json"]})
    seed_group(run, 1, [(0.0, "bb"), (1.0, "a"), (0.5, "ccc")])
    return run


def test_a_rescore_reward_reads_the_runs_attachment(alice, table_run):
    rescore = rescore_create(user=alice, run=table_run, reward_version=new_reward(alice, TABLE_REWARD))
    rescore_execute(rescore_id=rescore.id)
    rescore.refresh_from_db()
    assert rescore.status == "done", rescore.error
    scores = RescoreScore.objects.filter(rescore=rescore).select_related("trajectory")
    assert all(s.error == "" for s in scores), [s.error for s in scores]
    assert {s.trajectory.messages[-1]["content"]: s.new_reward for s in scores} == TABLE


def test_a_run_without_the_attachment_gives_its_reward_nothing_to_read(alice, table_run):
    """The control: the same reward over a run that names no attachment fails on every trajectory."""
    run = seed_run(alice, steps_done=1)
    seed_group(run, 1, [(0.0, "bb")])
    rescore = rescore_create(user=alice, run=run, reward_version=new_reward(alice, TABLE_REWARD))
    rescore_execute(rescore_id=rescore.id)
    assert "FileNotFoundError" in RescoreScore.objects.get(rescore=rescore).error


def test_an_attachment_deleted_since_the_run_is_refused_naming_it(alice, table_run):
    DataAttachment.objects.filter(owner=alice, name="scores.json").delete()
    with pytest.raises(ApplicationError) as caught:
        rescore_create(user=alice, run=table_run, reward_version=new_reward(alice, TABLE_REWARD))
    assert "data attachment 'scores.json' at /data/scores.json, which has been deleted" in caught.value.message
    assert caught.value.field_errors == {"run": ["scores.json: data attachment deleted"]}
    assert not Rescore.objects.exists()


def test_an_attachment_deleted_after_the_rescore_was_queued_fails_it_naming_it(alice, table_run):
    rescore = rescore_create(user=alice, run=table_run, reward_version=new_reward(alice, TABLE_REWARD))
    DataAttachment.objects.filter(owner=alice, name="scores.json").delete()  # past the delete guard
    rescore_execute(rescore_id=rescore.id)
    rescore.refresh_from_db()
    assert rescore.status == "failed" and "'scores.json'" in rescore.error and "Upload it again" in rescore.error
    assert not RescoreScore.objects.filter(rescore=rescore).exists()


def test_staff_rescoring_someone_elses_run_binds_the_owners_attachment(alice, staff, table_run):
    rescore = rescore_create(user=staff, run=table_run, reward_version=new_reward(staff, TABLE_REWARD))
    rescore_execute(rescore_id=rescore.id)
    rescore.refresh_from_db()
    assert rescore.status == "done", rescore.error
    assert sorted(RescoreScore.objects.filter(rescore=rescore).values_list("new_reward", flat=True)) == [
        0.25,
        0.5,
        0.75,
    ]
