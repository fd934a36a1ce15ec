"""Weights & Biases export with the real wandb package in offline mode: the files it writes (the run's
transaction log, the format `wandb sync` uploads, and its table files) hold the run's config, every
step's metrics, the validation results and the sample trajectories."""

import pytest

from tests.exports.wandb_files import read_run
from training.exports.services import export_sync, export_target_create
from training.models import ExportProgress, RunEvent


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return tmp_path


def test_it_writes_config_metrics_validation_and_trajectories(run_with_steps, wandb_offline, transactional_db):
    run = run_with_steps
    target = export_target_create(
        owner=run.owner, kind="wandb", settings={"project": "artweb-tests", "trajectories_per_step": 1}
    )
    assert export_sync(target_id=target.id, run_id=run.id) == 2

    progress = ExportProgress.objects.get(target=target, run=run)
    assert progress.last_step == 2 and not progress.finished and progress.remote_id
    wb = read_run(wandb_offline, progress.remote_id)
    assert wb["run"].display_name == "capitals" and wb["run"].project == "artweb-tests"
    assert wb["config"]["num_steps"] == 2
    assert wb["config"]["train"]["learning_rate"] == 1e-5
    assert wb["config"]["artweb"]["run_id"] == run.id

    s1, s2 = wb["history"][1], wb["history"][2]
    assert (s1["reward_mean"], s1["reward_std"], s1["loss"], s1["kl"], s1["grad_norm"]) == (0.5, 0.5, 0.25, 0.01, 1.5)
    assert s1["time/rollouts"] == 2.0 and s1["duration_s"] == 3.0
    assert s2["reward_mean"] == 1.0 and s2["val_reward"] == 0.75 and s2["validation/reward_mean"] == 0.75
    assert "val_reward" not in s1
    assert s1["trajectories"]["_type"] == "table-file"

    train_tables = [t for t in wb["tables"] if t["_file"].startswith("trajectories_")]
    train_rows = [row for t in train_tables for row in t["data"]]
    assert len(train_rows) == 2  # one sampled trajectory per step
    columns = train_tables[0]["columns"]
    conversation = train_rows[0][columns.index("conversation")]
    assert "What is the capital of France?" in conversation and "lookup" in conversation
    val_table = next(t for t in wb["tables"] if t["_file"].startswith("validation/"))
    assert val_table["data"][0][columns.index("reward")] == 0.75
    assert not RunEvent.objects.filter(run=run, kind="export_warning").exists()


def test_it_resumes_from_its_cursor_and_closes_the_run_at_its_end(run_with_steps, wandb_offline, transactional_db):
    from artweb.testing.factories import StepFactory

    run = run_with_steps
    target = export_target_create(owner=run.owner, kind="wandb", settings={"project": "artweb-tests"})
    export_sync(target_id=target.id, run_id=run.id)
    assert export_sync(target_id=target.id, run_id=run.id) == 0  # nothing new: nothing written

    StepFactory(run=run, step=3, reward_mean=0.9, metrics={"loss": 0.5})
    run.status, run.steps_done, run.best_val_reward = "completed", 3, 0.75
    run.save()
    assert export_sync(target_id=target.id, run_id=run.id) == 1

    progress = ExportProgress.objects.get(target=target, run=run)
    assert progress.last_step == 3 and progress.finished
    wb = read_run(wandb_offline, progress.remote_id)
    assert len(wb["dirs"]) == 2  # two attempts that did work; the empty one wrote nothing
    assert wb["history"][3]["reward_mean"] == 0.9 and wb["history"][3]["loss"] == 0.5
    assert wb["summary"]["status"] == "completed" and wb["summary"]["best_val_reward"] == 0.75
    assert export_sync(target_id=target.id, run_id=run.id) == 0


def test_it_logs_checkpoints_as_artifacts_when_asked(run_with_steps, wandb_offline, transactional_db, tmp_path):
    from artweb.testing.factories import CheckpointFactory

    run = run_with_steps
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    (ckpt_dir / "adapter_config.json").write_text('{"r": 8}')
    CheckpointFactory(run=run, step=2, path=str(ckpt_dir), val_reward=0.75)
    target = export_target_create(
        owner=run.owner, kind="wandb", settings={"project": "artweb-tests", "log_checkpoints": True}
    )
    export_sync(target_id=target.id, run_id=run.id)

    progress = ExportProgress.objects.get(target=target, run=run)
    from tests.exports.wandb_files import records

    d = read_run(wandb_offline, progress.remote_id)["dirs"][0]
    artifacts = [
        r.artifact
        for r in records(d / f"run-{progress.remote_id}.wandb")
        if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "model"
    ]
    assert len(artifacts) == 1
    assert artifacts[0].name == f"run-{run.id}-lora"
    assert {"step-2", "latest"} <= set(artifacts[0].aliases)
