"""The step source of client-driven runs (training.services.steps.sources): a run's oldest pending
training job becomes its next step, and the job's events tell the polling client how it goes.

Events are written as the step reaches each point: training_started (with the number of sequences) as
the update begins, gradient_step with the update's figures, and training_ended inside the step's commit
transaction, after the checkpoint row: a client that lists checkpoints on training_ended finds the new
step. A step that ends without its commit writes training_failed instead, once.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from rollouts.models import Scenario
from training.client_runs.models import ClientTrainingJob, ClientTrainingJobEvent
from training.client_runs.services import client_job_fail
from training.services.steps.sources import PostedGroup, PostedStep

# The update's figures the client's progress bar and metrics read (ART canonicalises loss, grad_norm,
# entropy, learning_rate and the token counts; the rest it keeps under their own names).
GRADIENT_KEYS = ("loss", "policy_loss", "grad_norm", "entropy", "learning_rate", "kl", "sampler_kl", "tokens_trained")


def _event(job_id: int, kind: str, data: dict) -> None:
    ClientTrainingJobEvent.objects.create(job_id=job_id, type=kind, data=data)


class ClientJobSource:
    def pending(self, run) -> bool:
        return ClientTrainingJob.objects.filter(run_id=run.id, status__in=ClientTrainingJob.PENDING).exists()

    def take(self, run, step: int) -> PostedStep | None:
        job = (
            ClientTrainingJob.objects.filter(run_id=run.id, status__in=ClientTrainingJob.PENDING).order_by("id").first()
        )
        if job is None:
            return None
        ClientTrainingJob.objects.filter(id=job.id, status=ClientTrainingJob.Status.QUEUED).update(
            status=ClientTrainingJob.Status.RUNNING
        )
        by_id = Scenario.objects.in_bulk([g["scenario"] for g in job.groups])
        return PostedStep(
            key=job.id,
            scenarios=[by_id[g["scenario"]] for g in job.groups],
            # A fresh copy per attempt: the trainer completes turns in place.
            groups=[
                PostedGroup(
                    trajectories=[dict(t, messages=[dict(m) for m in t["messages"]]) for t in g["trajectories"]]
                )
                for g in job.groups
            ],
            settings=dict(job.settings),
            metrics={k: float(v) for k, v in (job.tokens or {}).items()},
        )

    def started(self, posted: PostedStep, *, num_sequences: int) -> None:
        # Once per job however many attempts: a retried step's client already saw it.
        if not ClientTrainingJobEvent.objects.filter(
            job_id=posted.key, type=ClientTrainingJobEvent.Type.STARTED
        ).exists():
            _event(posted.key, ClientTrainingJobEvent.Type.STARTED, {"num_sequences": num_sequences})

    def trained(self, posted: PostedStep, metrics: dict[str, float]) -> None:
        _event(
            posted.key,
            ClientTrainingJobEvent.Type.GRADIENT_STEP,
            {k: metrics[k] for k in GRADIENT_KEYS if k in metrics},
        )

    def committed(self, posted: PostedStep, *, step: int) -> None:
        assert transaction.get_connection().in_atomic_block, "called inside the step's commit"
        ClientTrainingJob.objects.filter(id=posted.key).update(
            status=ClientTrainingJob.Status.DONE, step=step, finished_at=timezone.now()
        )
        _event(posted.key, ClientTrainingJobEvent.Type.ENDED, {"step": step})

    def failed(self, posted: PostedStep, message: str) -> None:
        client_job_fail(job=ClientTrainingJob.objects.get(id=posted.key), message=message)


CLIENT_SOURCE = ClientJobSource()
