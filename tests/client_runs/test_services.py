"""ART's ServerlessBackend protocol under /api/v1/art/, through Django's test client with a Bearer token as
ART's client sends it: registering, training jobs, their events, checkpoints, quotas, model.log(), and the
inference names. No worker runs here: the RUN_STEP message a job owes is recorded instead of sent."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse
from rest_framework.authtoken.models import Token

from artweb.testing.factories import BaseModelFactory, CheckpointFactory, RunFactory, StepFactory
from rollouts.models import Scenario, ScenarioSet
from tests.client_runs.test_wire import group
from training.client_runs.models import ClientModel, ClientTrainingJob, ClientTrainingJobEvent
from training.client_runs.services import ClientError, client_inference_target
from training.models import Checkpoint, Run, RunEvent, Step
from training.services import run_cancel

BASE = "/api/v1/art"
MODEL = "SmolLM2-135M-Instruct"


class Art:
    """What ART's ServerlessBackend sends: JSON bodies and `Authorization: Bearer <artweb API token>`."""

    def __init__(self, client, user):
        self.client = client
        self.headers = {"Authorization": f"Bearer {Token.objects.create(user=user).key}"} if user else {}

    def post(self, path, body):
        return self.client.post(BASE + path, json.dumps(body), content_type="application/json", headers=self.headers)

    def get(self, path, **params):
        return self.client.get(BASE + path, params, headers=self.headers)

    def delete(self, path, body=None):
        data = json.dumps(body) if body is not None else ""
        return self.client.delete(BASE + path, data, content_type="application/json", headers=self.headers)

    def register(self, name="agent", base_model=MODEL, **extra) -> dict:
        body = {"entity": None, "project": "demo", "name": name, "base_model": base_model, "return_existing": True}
        response = self.post("/preview/models", {**body, **extra})
        assert response.status_code == 200, response.content
        return response.json()

    def train(self, model_id, *groups, config=None):
        body = {"model_id": model_id, "trajectory_groups": list(groups or [group(1.0, 0.0), group(0.5, 0.0)])}
        if config is not None:
            body["experimental_config"] = config
        return self.post("/preview/training-jobs", body)


@pytest.fixture
def base_model(db):
    return BaseModelFactory()


@pytest.fixture
def art(client, alice, base_model):
    return Art(client, alice)


@pytest.fixture
def sent(monkeypatch):
    """RUN_STEP messages, recorded instead of sent to a broker (no worker in these tests)."""
    from training import tasks

    calls = []
    monkeypatch.setattr(tasks.run_step_task, "apply_async", lambda args, kwargs: calls.append((args, kwargs)))
    return calls


def error(response) -> str:
    return response.json()["error"]["message"]


# --- registering ---------------------------------------------------------------------------------------


def test_register_creates_a_waiting_client_run_with_its_scenario_set(art, alice):
    model = art.register()

    assert model == {
        "id": model["run_id"],
        "entity": "alice",
        "project": "demo",
        "name": "agent",
        "base_model": MODEL,
        "run_id": model["run_id"],
    }
    run = Run.objects.get(id=int(model["id"]))
    assert run.owner == alice and run.driver == Run.Driver.CLIENT and run.status == Run.Status.WAITING
    assert run.script_version is None and run.num_steps == 0 and run.config["val_every"] == 0
    assert run.scenario_set.name == "ART client: alice/demo/agent" and run.scenario_set.scenarios.count() == 0
    assert run.client_model.inference_name == "wandb-artifact:///alice/demo/agent"
    assert list(run.events.values_list("kind", flat=True)) == ["created"]


def test_register_again_returns_the_same_model_by_name_or_hugging_face_id(art, base_model):
    first = art.register()
    assert art.register(base_model=base_model.source) == first
    assert ClientModel.objects.count() == 1 and Run.objects.count() == 1

    response = art.post("/preview/models", {"project": "demo", "name": "agent", "base_model": MODEL})
    assert response.status_code == 409 and "is registered already" in error(response)  # no return_existing


def test_register_with_another_base_model_for_the_same_name_is_refused(art):
    art.register()
    BaseModelFactory(name="other-model", source="org/other-model")
    response = art.post(
        "/preview/models", {"project": "demo", "name": "agent", "base_model": "other-model", "return_existing": True}
    )
    assert response.status_code == 409
    assert f"trains {MODEL}, not 'other-model'; register another name" in error(response)


def test_register_with_an_unknown_base_model_lists_the_usable_ones(art):
    response = art.post("/preview/models", {"project": "demo", "name": "agent", "base_model": "gpt-5"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "base_model"
    assert "'gpt-5' is not a base model you may train" in error(response) and f"yours: {MODEL}." in error(response)
    assert not Run.objects.exists()


def test_register_past_the_concurrent_runs_quota_is_refused(art, alice, settings):
    settings.ARTWEB_QUOTA_CONCURRENT_RUNS = 1
    RunFactory(owner=alice, status=Run.Status.RUNNING)
    response = art.post("/preview/models", {"project": "demo", "name": "agent", "base_model": MODEL})
    assert response.status_code == 429 and "You have 1 runs queued or running" in error(response)
    assert not ClientModel.objects.exists() and Run.objects.count() == 1


def test_a_call_without_a_valid_token_is_refused(client, base_model):
    response = Art(client, None).post("/preview/models", {"project": "demo", "name": "m", "base_model": MODEL})
    assert response.status_code == 401 and "Authorization: Bearer <token>" in error(response)
    client_with_bad_token = Art(client, None)
    client_with_bad_token.headers = {"Authorization": "Bearer nope"}
    assert client_with_bad_token.get("/preview/models/1").status_code == 401


def test_another_users_token_finds_nothing_of_it(art, client, bob, sent):
    model = art.register()
    job = art.train(model["id"]).json()["id"]
    bobs = Art(client, bob)
    assert bobs.get(f"/preview/models/{model['id']}").status_code == 404
    assert bobs.get(f"/preview/models/{model['id']}/checkpoints").status_code == 404
    assert bobs.delete(f"/preview/models/{model['id']}/checkpoints", {"steps": [1]}).status_code == 404
    assert bobs.get(f"/preview/training-jobs/{job}/events").status_code == 404
    assert bobs.train(model["id"]).status_code == 404
    assert bobs.delete(f"/preview/models/{model['id']}").status_code == 404
    assert ClientTrainingJob.objects.count() == 1 and ClientModel.objects.count() == 1


def test_deleting_the_model_cancels_its_run_and_frees_the_name(art):
    model = art.register()
    assert art.delete(f"/preview/models/{model['id']}").json() == {"id": model["id"], "deleted": True}
    assert Run.objects.get(id=int(model["id"])).status == Run.Status.CANCELLED
    assert art.register()["id"] != model["id"]


# --- training jobs -------------------------------------------------------------------------------------


def test_a_training_job_queues_the_run_and_sends_its_step_message_after_commit(
    art, sent, django_capture_on_commit_callbacks
):
    model = art.register()
    with django_capture_on_commit_callbacks() as callbacks:
        response = art.train(model["id"], group(1.0, 0.0, metadata={"q": 1}), group(1.0, 0.5, metadata={"q": 2}))
    assert response.status_code == 200
    run = Run.objects.get(id=int(model["id"]))
    assert run.status == Run.Status.QUEUED and run.num_steps == 1
    assert sent == [] and run.dispatched_at is None  # owed until the commit
    for callback in callbacks:
        callback()
    assert sent == [((run.id,), {})]
    assert Run.objects.get(id=run.id).dispatched_at is not None

    job = ClientTrainingJob.objects.get(id=int(response.json()["id"]))
    scenarios = list(Scenario.objects.filter(scenario_set=run.scenario_set).order_by("index"))
    assert [s.data for s in scenarios] == [{"q": 1}, {"q": 2}]
    assert [g["scenario"] for g in job.groups] == [s.id for s in scenarios]
    assert job.status == ClientTrainingJob.Status.QUEUED and job.tokens["client_turns_sampled"] == 4
    assert [t["reward"] for t in job.groups[1]["trajectories"]] == [1.0, 0.5]
    assert run.events.filter(kind="client_job", data__job=job.id).exists()


def test_a_second_job_queues_behind_the_first_and_reuses_known_scenarios(art, sent, django_capture_on_commit_callbacks):
    model = art.register()
    with django_capture_on_commit_callbacks(execute=True):
        first = art.train(model["id"], group(1.0, 0.0, metadata={"q": 1}), group(1.0, 0.5, metadata={"q": 2}))
        second = art.train(model["id"], group(1.0, 0.0, metadata={"q": 3}), group(0.0, 0.5, metadata={"q": 1}))
    assert first.status_code == second.status_code == 200

    run = Run.objects.get(id=int(model["id"]))
    assert run.status == Run.Status.QUEUED and run.num_steps == 2
    assert len(sent) == 1  # the run's one step message; the second job waits for the first
    assert list(run.client_jobs.values_list("status", flat=True)) == ["queued", "queued"]
    scenarios = {s.data["q"]: s.id for s in Scenario.objects.filter(scenario_set=run.scenario_set)}
    assert sorted(scenarios) == [1, 2, 3] and ScenarioSet.objects.get(id=run.scenario_set_id).train_count == 3
    assert [g["scenario"] for g in run.client_jobs.last().groups] == [scenarios[3], scenarios[1]]


def test_a_bad_job_is_refused_naming_where_and_nothing_is_written(art, sent):
    model = art.register()
    response = art.train(model["id"], group(1.0, 0.0), group(1.0))
    assert response.status_code == 400 and "group 1 has 1 trajectories" in error(response)
    response = art.train(model["id"], config={"kimi_k2_tau": 0.5})
    assert response.status_code == 400 and response.json()["error"]["param"] == "experimental_config.kimi_k2_tau"
    assert not ClientTrainingJob.objects.exists() and not Scenario.objects.exists()
    assert Run.objects.get(id=int(model["id"])).status == Run.Status.WAITING and sent == []


@pytest.mark.parametrize(
    "status, says",
    [
        (Run.Status.PAUSED, "is paused on artweb; resume it on its page ({url}), then train again."),
        (Run.Status.CANCELLED, "was cancelled on artweb; retry it on its page ({url}) to go on from its last"),
        (Run.Status.FAILED, "failed on artweb (CUDA error: out of memory); retry it on its page ({url})"),
        (Run.Status.COMPLETED, "is completed on artweb; register a model under another name to train again."),
    ],
)
def test_a_job_for_a_run_stopped_on_artweb_is_refused_saying_what_to_do(art, sent, status, says):
    model = art.register()
    run_id = int(model["id"])
    Run.objects.filter(id=run_id).update(status=status, error="CUDA error: out of memory")
    response = art.train(model["id"])
    assert response.status_code == 409
    assert error(response).startswith(f"The run 'alice/demo/agent' (#{run_id}) ")
    assert says.format(url=reverse("run-detail", args=[run_id])) in error(response)
    assert not ClientTrainingJob.objects.exists() and sent == []


def test_a_job_past_the_steps_per_day_quota_is_refused_with_the_quota(art, alice, settings, sent):
    settings.ARTWEB_QUOTA_STEPS_PER_DAY = 1
    model = art.register()
    StepFactory(run=RunFactory(owner=alice, status=Run.Status.COMPLETED), step=1)
    response = art.train(model["id"])
    assert response.status_code == 429
    assert error(response).startswith(
        "The training job was refused: your runs trained 1 steps in the last 24 hours, the limit of your quota "
        "(1 steps a day, the default). Train again after "
    )
    assert "Paused" not in error(response) and "Resume" not in error(response)  # the run waits, unpaused
    assert Run.objects.get(id=int(model["id"])).status == Run.Status.WAITING
    assert not ClientTrainingJob.objects.exists() and sent == []


def test_a_job_past_the_storage_quota_is_refused_with_the_quota(art, settings, sent):
    settings.ARTWEB_QUOTA_TRAJECTORY_MB = 1
    model = art.register()
    Run.objects.filter(id=int(model["id"])).update(trajectory_bytes=2 << 20)
    response = art.train(model["id"])
    assert response.status_code == 429
    assert error(response) == (
        "The training job was refused: your runs' stored trajectories take 2.0\xa0MB, the limit of your storage "
        "quota (1.0\xa0MB, the default). Delete runs you no longer need or ask an operator to raise your quota, "
        "then train again. Nothing of it was stored."
    )
    assert not ClientTrainingJob.objects.exists() and sent == []


def test_a_job_that_would_go_past_the_storage_quota_is_refused_before_anything_is_stored(art, settings, sent):
    settings.ARTWEB_QUOTA_TRAJECTORY_MB = 1
    model = art.register()
    Run.objects.filter(id=int(model["id"])).update(trajectory_bytes=(1 << 20) - 100)  # under the limit, barely
    response = art.train(model["id"])
    assert response.status_code == 429
    assert error(response).startswith("The training job's trajectories take ")
    assert "more than is left of your storage quota" in error(response) and "Nothing of it was stored" in error(
        response
    )
    assert not ClientTrainingJob.objects.exists() and sent == []


def test_sft_jobs_are_refused_as_not_supported(art):
    response = art.post("/preview/sft-training-jobs", {"model_id": "1"})
    assert response.status_code == 400 and "Supervised fine-tuning (train_sft) is not supported" in error(response)


# --- a job's events ------------------------------------------------------------------------------------


def _job(art, sent) -> ClientTrainingJob:
    model = art.register()
    return ClientTrainingJob.objects.get(id=int(art.train(model["id"]).json()["id"]))


def test_events_page_with_after_and_has_more(art, sent):
    job = _job(art, sent)
    kinds = ["training_started", "gradient_step", "training_ended"]
    made = [ClientTrainingJobEvent.objects.create(job=job, type=k, data={"n": i}) for i, k in enumerate(kinds)]
    path = f"/preview/training-jobs/{job.id}/events"

    page = art.get(path, limit=2).json()
    assert [e["type"] for e in page["data"]] == kinds[:2] and page["has_more"] is True
    assert page["data"][0] == {"id": str(made[0].id), "type": "training_started", "data": {"n": 0}}
    page = art.get(path, after=page["data"][-1]["id"]).json()
    assert [e["type"] for e in page["data"]] == ["training_ended"] and page["has_more"] is False
    assert art.get(path, after=made[-1].id).json() == {"object": "list", "data": [], "has_more": False}
    assert art.get(path, after="x").status_code == 400
    assert art.get(path, limit=0).status_code == 400 and art.get(path, limit=1001).status_code == 400


def test_a_pending_job_of_a_run_cancelled_on_the_page_fails_when_polled_once(art, alice, sent):
    job = _job(art, sent)
    run_cancel(run=Run.objects.get(id=job.run_id), actor=alice)
    path = f"/preview/training-jobs/{job.id}/events"

    first = art.get(path).json()["data"]
    again = art.get(path).json()["data"]
    assert [e["type"] for e in first] == [e["type"] for e in again] == ["training_failed"]
    message = first[0]["data"]["error_message"]
    assert "was cancelled on artweb" in message and message.endswith("nothing of this job was trained.")
    job.refresh_from_db()
    assert job.status == ClientTrainingJob.Status.FAILED and job.error == message
    assert art.train(str(job.run_id)).status_code == 409


# --- checkpoints ---------------------------------------------------------------------------------------


@pytest.fixture
def trained(art):
    """A registered model whose run has done five steps, each with a checkpoint (step 2's deleted)."""
    model = art.register()
    run = Run.objects.get(id=int(model["id"]))
    Run.objects.filter(id=run.id).update(steps_done=5, num_steps=5)
    for step in range(1, 6):
        CheckpointFactory(run=run, step=step, metrics={"reward": step / 10, "note": "x"})
    Checkpoint.objects.filter(run=run, step=2).update(state=Checkpoint.State.DELETED)
    return model


def test_checkpoints_page_by_after_in_either_order(art, trained):
    path = f"/preview/models/{trained['id']}/checkpoints"
    ids = dict(Checkpoint.objects.filter(run_id=int(trained["id"])).values_list("step", "id"))

    page = art.get(path).json()
    assert [c["step"] for c in page["data"]] == [1, 3, 4, 5] and page["has_more"] is False
    assert page["data"][0] == {"id": str(ids[1]), "step": 1, "metrics": {"reward": 0.1}}

    seen, after = [], None
    while True:  # as ART's client pages: after = the last id, until has_more is false
        page = art.get(path, order="desc", limit=3, **({"after": after} if after else {})).json()
        seen.append([c["step"] for c in page["data"]])
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    assert seen == [[5, 4, 3], [1]]
    assert art.get(path, limit=0).status_code == 400 and art.get(path, order="sideways").status_code == 400
    assert art.get(path, after="999999").status_code == 400


def test_deleting_checkpoints_reports_the_steps_not_found(art, trained):
    path = f"/preview/models/{trained['id']}/checkpoints"
    response = art.delete(path, {"steps": [1, 2, 3, 99]})
    assert response.json() == {"deleted_count": 2, "not_found_steps": [2, 99]}
    states = dict(Checkpoint.objects.filter(run_id=int(trained["id"])).values_list("step", "state"))
    assert states == {1: "deleted", 2: "deleted", 3: "deleted", 4: "active", 5: "active"}
    assert art.delete(path, {"steps": "all"}).status_code == 400


def test_the_newest_checkpoint_of_a_run_that_may_train_on_is_kept(art, trained):
    path = f"/preview/models/{trained['id']}/checkpoints"
    response = art.delete(path, {"steps": [4, 5]})
    assert response.status_code == 409 and "checkpoint of step 5 cannot be deleted: it is the newest" in error(response)
    states = dict(Checkpoint.objects.filter(run_id=int(trained["id"]), step__gte=4).values_list("step", "state"))
    assert states == {4: "active", 5: "active"}  # refused whole: nothing half done

    Run.objects.filter(id=int(trained["id"])).update(status=Run.Status.COMPLETED)
    assert art.delete(path, {"steps": [5]}).json() == {"deleted_count": 1, "not_found_steps": []}


# --- model.log() (ART up to 0.5.7) ---------------------------------------------------------------------


def test_a_logged_val_split_records_the_validation_reward(art, trained):
    run_id = int(trained["id"])
    StepFactory(run=Run.objects.get(id=run_id), step=5)
    path = f"/preview/models/{trained['id']}/log"

    def log(split, *rewards):
        groups = [{"trajectories": [{"reward": r} for r in rewards]}]
        return art.post(path, {"model_id": trained["id"], "trajectory_groups": groups, "split": split})

    assert log("val", 0.5, 1.0).status_code == 200
    assert log("train", 0.0, 0.0).status_code == 200  # not a validation: the run's best stays
    assert log("val", 0.25, 0.25).status_code == 200
    run = Run.objects.get(id=run_id)
    assert run.best_val_reward == 0.75
    assert Step.objects.get(run=run, step=5).val_reward == 0.25  # the latest step's, as logged last
    assert Checkpoint.objects.get(run=run, step=5).val_reward == 0.25
    messages = list(RunEvent.objects.filter(run=run, kind="client_log").values_list("message", flat=True))
    assert messages[0] == "The ART client logged 1 val groups, mean reward 0.7500."
    assert art.post(path, {"trajectory_groups": []}).status_code == 400


# --- inference names -----------------------------------------------------------------------------------


def test_inference_names_resolve_to_the_runs_checkpoints(art, alice, trained):
    name = "wandb-artifact:///alice/demo/agent"
    run, ckpt = client_inference_target(user=alice, name=name)
    assert run.id == int(trained["id"]) and ckpt.step == 5
    assert client_inference_target(user=alice, name=f"{name}:step3")[1].step == 3
    assert client_inference_target(user=alice, name=f"{name}:step0")[1] is None  # the base model

    for bad, status in [
        (f"{name}:step2", 404),  # deleted
        (f"{name}:step9", 404),
        (f"{name}:latest", 400),
        ("wandb-artifact:///alice/demo/other", 404),
        ("wandb-artifact:///alice/agent", 404),
    ]:
        with pytest.raises(ClientError) as exc:
            client_inference_target(user=alice, name=bad)
        assert exc.value.status == status, bad


def test_a_model_before_its_first_step_serves_the_base_model(art, alice):
    art.register()
    run, ckpt = client_inference_target(user=alice, name="wandb-artifact:///alice/demo/agent")
    assert run.steps_done == 0 and ckpt is None


@pytest.mark.parametrize("status", [Run.Status.CANCELLED, Run.Status.PAUSED])
def test_a_stopped_runs_name_is_refused_for_inference(art, alice, bob, trained, status):
    Run.objects.filter(id=int(trained["id"])).update(status=status)
    with pytest.raises(ClientError) as exc:
        client_inference_target(user=alice, name="wandb-artifact:///alice/demo/agent")
    assert exc.value.status == 409 and "on artweb" in exc.value.message
    with pytest.raises(ClientError) as exc:
        client_inference_target(user=bob, name="wandb-artifact:///alice/demo/agent")
    assert exc.value.status == 404
