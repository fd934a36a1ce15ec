"""Re-scores over the API: start one, follow it, read its figures and scores; owner-scoped throughout.

The task that runs a re-score is queued after commit for the default queue's worker; none runs in API
tests, so the queueing call is caught, and the re-score is then run here by its service (the real jailed
sandbox) where a test needs its results.
"""

from unittest import mock

import pytest

from tests.analytics.test_rescores import new_reward, seed_group, seed_run
from tests.api.conftest import assert_error
from training.analytics.rescores import rescore_execute
from training.models import JudgeEndpoint, Rescore

pytestmark = pytest.mark.django_db


@pytest.fixture
def enqueued():
    with (
        mock.patch("artweb.dispatch.transaction.on_commit", side_effect=lambda send: send()),
        mock.patch("training.tasks.rescore_execute_task.apply_async") as send,
    ):
        yield send


@pytest.fixture
def run(alice):
    run = seed_run(alice, steps_done=2)
    seed_group(run, 1, [(0.0, "bb"), (1.0, "a"), (0.5, "ccc")])
    seed_group(run, 2, [(1.0, "dddd"), (0.0, "a"), (0.5, "bb")])
    return run


def test_it_starts_a_rescore_follows_it_and_lists_disagreements_first(alice, alice_api, run, enqueued):
    version = new_reward(alice)
    response = alice_api.post(f"/api/v1/runs/{run.id}/rescores/", {"reward_version": version.id}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    enqueued.assert_called_once_with(args=(body["id"],), kwargs={})
    assert (body["status"], body["run"], body["split"], body["use_ruler"]) == ("queued", run.id, "train", False)
    assert body["reward"] == {
        "id": version.asset_id,
        "name": version.asset.name,
        "version": 1,
        "version_id": version.id,
    }

    rescore_execute(rescore_id=body["id"])
    detail = alice_api.get(f"/api/v1/rescores/{body['id']}/").json()
    assert detail["status"] == "done" and (detail["trajectories_done"], detail["trajectories_total"]) == (6, 6)
    assert detail["summary"]["pair_agreement"] == pytest.approx(4 / 6)
    assert detail["summary"]["curve"]["steps"] == [1, 2]

    page = alice_api.get(f"/api/v1/rescores/{body['id']}/scores/?limit=2").json()
    assert page["count"] == 6 and page["next"]
    # Largest rank gap first (see the service test's hand computation): 4, then 2.
    assert [(r["old_reward"], r["new_reward"], r["rank_gap"]) for r in page["results"]] == [
        (1.0, 1.0, 4.0),
        (0.0, 2.0, 2.0),
    ]
    by_step = alice_api.get(f"/api/v1/rescores/{body['id']}/scores/?ordering=step").json()["results"]
    assert [r["step"] for r in by_step] == [1, 1, 1, 2, 2, 2]
    assert by_step[0]["metrics"] == {"from_the_run": 1, "chars": 2} and by_step[0]["error"] == ""

    listed = alice_api.get(f"/api/v1/runs/{run.id}/rescores/").json()
    assert [r["id"] for r in listed["results"]] == [body["id"]]


def test_it_takes_ruler_with_a_judge_endpoint(alice, alice_api, run, enqueued):
    JudgeEndpoint.objects.create(owner=alice, name="judge", base_url="https://judge.example.com/v1", model="j")
    body = alice_api.post(
        f"/api/v1/runs/{run.id}/rescores/", {"use_ruler": True, "ruler_judge": "endpoint:judge"}, format="json"
    ).json()
    assert (body["use_ruler"], body["ruler_judge"], body["reward"]) == (True, "endpoint:judge", None)


@pytest.mark.parametrize(
    "payload, field, says",
    [
        ({}, "reward_version", "a reward function version, or RULER"),
        ({"reward_version": 999999}, "reward_version", "No reward function version 999999 among yours"),
        ({"use_ruler": True}, "ruler_judge", "needs a judge endpoint"),
        ({"use_ruler": True, "ruler_judge": "model:SmolLM2-135M-Instruct"}, "ruler_judge", "needs a judge endpoint"),
        ({"reward_version": "x"}, "reward_version", None),
        ({"split": "test"}, "split", None),
    ],
)
def test_it_refuses_bad_input_with_what_to_fix(alice_api, run, enqueued, payload, field, says):
    response = alice_api.post(f"/api/v1/runs/{run.id}/rescores/", payload, format="json")
    assert_error(response, 400, field=field, contains=says)
    enqueued.assert_not_called()
    assert not Rescore.objects.exists()


def test_a_run_with_nothing_stored_yet_is_refused(alice, alice_api, enqueued):
    empty = seed_run(alice, steps_done=0)
    response = alice_api.post(
        f"/api/v1/runs/{empty.id}/rescores/", {"reward_version": new_reward(alice).id}, format="json"
    )
    assert_error(response, 400, field="run", contains="Nothing to re-score yet")


def test_another_users_run_rescore_and_reward_are_not_found(alice, bob, alice_api, bob_api, run, enqueued):
    mine = alice_api.post(
        f"/api/v1/runs/{run.id}/rescores/", {"reward_version": new_reward(alice).id}, format="json"
    ).json()
    assert bob_api.get(f"/api/v1/runs/{run.id}/rescores/").status_code == 404
    assert (
        bob_api.post(
            f"/api/v1/runs/{run.id}/rescores/", {"reward_version": new_reward(bob).id}, format="json"
        ).status_code
        == 404
    )
    assert bob_api.get(f"/api/v1/rescores/{mine['id']}/").status_code == 404
    assert bob_api.get(f"/api/v1/rescores/{mine['id']}/scores/").status_code == 404
    # bob's reward on alice's run, through alice: not hers, so not found among hers.
    response = alice_api.post(f"/api/v1/runs/{run.id}/rescores/", {"reward_version": new_reward(bob).id}, format="json")
    assert_error(response, 400, field="reward_version", contains="among yours")


def test_it_requires_authentication(anon_api, run):
    assert anon_api.get(f"/api/v1/runs/{run.id}/rescores/").status_code in (401, 403)
