"""One row of each kind that has an owner, made for a persona: what the visibility tests (pages, API and
artweb.visibility itself) check staff, the owner and a stranger against."""

from artweb.testing.factories import RunFactory
from training.exports.services import export_target_create
from training.models import DryRun, JudgeEndpoint, Rescore


def run_of(owner):
    return RunFactory(owner=owner, name=f"{owner.username}-run")


def dry_run_of(owner):
    run = run_of(owner)
    return DryRun.objects.create(
        owner=owner, script_version=run.script_version, base_model=run.base_model, scenarios=[{"prompt": "p"}]
    )


def rescore_of(owner):
    return Rescore.objects.create(owner=owner, run=run_of(owner))


def judge_of(owner, name: str = "j"):
    return JudgeEndpoint.objects.create(owner=owner, name=name, base_url="https://judge.example.com/v1", model="m")


def export_target_of(owner):
    return export_target_create(owner=owner, kind="wandb", settings={"project": "p"})
