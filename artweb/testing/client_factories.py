"""factory_boy factories for client-driven runs (training.client_runs), built from rows as
`client_model_register` and a committed training job leave them: a run of driver "client" without a
script or a reward function, waiting for its client, its scenario set "ART client: <entity>/<project>/<name>",
the ART client's registered model, and its training jobs."""

import factory
from django.utils import timezone

from artweb.testing.factories import RunFactory, ScenarioSetFactory
from training.client_runs.models import ClientModel, ClientTrainingJob, ClientTrainingJobEvent
from training.models import Run


class ClientModelFactory(factory.django.DjangoModelFactory):
    """The model an ART client registered; its run is built with it unless given."""

    class Meta:
        model = ClientModel

    run = factory.SubFactory("artweb.testing.client_factories.ClientRunFactory", client_model=None)
    owner = factory.SelfAttribute("run.owner")
    entity = factory.LazyAttribute(lambda o: o.owner.get_username())
    project = "agents"
    name = factory.Sequence(lambda n: f"agent-{n}")
    base_model_requested = factory.SelfAttribute("run.base_model.source")
    contacted_at = factory.LazyFunction(timezone.now)


class ClientRunFactory(RunFactory):
    """A client-driven run with its ClientModel (`client_model__contacted_at=...` and the like reach it;
    `client_model=None` leaves it out). Its scenario set starts empty: add a Scenario per group."""

    class Meta:
        model = Run
        skip_postgeneration_save = True

    class Params:
        project = "agents"
        model_name = factory.Sequence(lambda n: f"agent-{n}")

    name = factory.LazyAttribute(lambda o: f"{o.owner.get_username()}/{o.project}/{o.model_name}")
    tags = factory.LazyAttribute(lambda o: ["art-client", o.project])
    driver = Run.Driver.CLIENT
    status = Run.Status.WAITING
    script_version = None
    reward_version = None
    scenario_set = factory.SubFactory(
        ScenarioSetFactory,
        owner=factory.SelfAttribute("..owner"),
        name=factory.LazyAttribute(lambda o: f"ART client: {o.factory_parent.name}"),
        description="Filled by the ART client's training jobs.",
        train_count=0,
        validation_count=0,
    )
    config = factory.LazyFunction(lambda: {"val_every": 0})
    num_steps = 0
    client_model = factory.RelatedFactory(
        ClientModelFactory,
        factory_related_name="run",
        project=factory.SelfAttribute("..project"),
        name=factory.SelfAttribute("..model_name"),
    )


class ClientTrainingJobFactory(factory.django.DjangoModelFactory):
    """A training job the client posted; by default one that became `step` (done, with its events)."""

    class Meta:
        model = ClientTrainingJob
        skip_postgeneration_save = True

    run = factory.SubFactory(ClientRunFactory)
    status = ClientTrainingJob.Status.DONE
    groups = factory.LazyFunction(list)
    settings = factory.LazyFunction(lambda: {"learning_rate": 1e-5})
    tokens = factory.LazyFunction(
        lambda: {"client_turns_sampled": 4, "client_turns_retokenized": 0, "client_turns_policy_logprobs": 0}
    )
    step = factory.Sequence(lambda n: n + 1)
    finished_at = factory.LazyFunction(timezone.now)

    @factory.post_generation
    def events(obj, create, extracted, **kwargs):
        """The events the client polled: started, a gradient step, then ended or failed."""
        if not create or obj.status in ClientTrainingJob.PENDING:
            return
        Type = ClientTrainingJobEvent.Type
        rows = [(Type.STARTED, {"num_sequences": 4}), (Type.GRADIENT_STEP, {"loss": 0.1, "grad_norm": 1.0})]
        if obj.status == ClientTrainingJob.Status.DONE:
            rows.append((Type.ENDED, {"step": obj.step}))
        else:
            rows = [(Type.FAILED, {"error_message": obj.error})]
        for kind, data in rows:
            ClientTrainingJobEvent.objects.create(job=obj, type=kind, data=data)
