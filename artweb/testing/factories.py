"""factory_boy factories for rows. Uploaded content is a small valid ART-style script and reward."""

import hashlib

import factory
from django.contrib.auth import get_user_model

from rollouts.models import (
    RewardFunction,
    RewardFunctionVersion,
    RolloutScript,
    RolloutScriptVersion,
    Scenario,
    ScenarioSet,
)
from training.models import Checkpoint, PretrainedModel, Run, Step, Trajectory, TrajectoryGroup

SCRIPT = """import art


async def rollout(model: art.Model, scenario) -> art.Trajectory:
    client = model.openai_client()
    traj = art.Trajectory(messages_and_choices=[], reward=0.0)
    messages = [{"role": "user", "content": scenario["prompt"]}]
    traj.messages_and_choices.extend(messages)
    completion = await client.chat.completions.create(model=model.name, messages=messages)
    traj.messages_and_choices.append(completion.choices[0])
    return traj
"""

REWARD = """def reward(trajectory, scenario):
    text = trajectory.messages_and_choices[-1]["content"] or ""
    return 1.0 if scenario["answer"].lower() in text.lower() else 0.0
"""


def _sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda o: f"{o.username}@example.com")
    password = factory.PostGenerationMethodCall("set_password", "pass-123-word")


class BaseModelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PretrainedModel
        django_get_or_create = ("name",)

    name = "SmolLM2-135M-Instruct"
    source = "HuggingFaceTB/SmolLM2-135M-Instruct"


class RolloutScriptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = RolloutScript

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"script-{n}")


class RolloutScriptVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = RolloutScriptVersion

    asset = factory.SubFactory(RolloutScriptFactory)
    number = 1
    content = SCRIPT
    sha256 = factory.LazyAttribute(lambda o: _sha(o.content))


class RewardFunctionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = RewardFunction

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"reward-{n}")


class RewardFunctionVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = RewardFunctionVersion

    asset = factory.SubFactory(RewardFunctionFactory)
    number = 1
    content = REWARD
    kind = "trajectory"
    sha256 = factory.LazyAttribute(lambda o: _sha(o.content))


class ScenarioSetFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ScenarioSet
        skip_postgeneration_save = True

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"scenarios-{n}")
    sha256 = "0" * 64
    train_count = 4
    validation_count = 2

    @factory.post_generation
    def scenarios(obj, create, extracted, **kwargs):
        if not create:
            return
        for i in range(obj.train_count + obj.validation_count):
            Scenario.objects.create(
                scenario_set=obj,
                index=i,
                split="train" if i < obj.train_count else "validation",
                data={"prompt": f"Say the word w{i}.", "answer": f"w{i}"},
            )


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"run-{n}")
    base_model = factory.SubFactory(BaseModelFactory)
    script_version = factory.SubFactory(RolloutScriptVersionFactory, asset__owner=factory.SelfAttribute("...owner"))
    reward_version = factory.SubFactory(RewardFunctionVersionFactory, asset__owner=factory.SelfAttribute("...owner"))
    scenario_set = factory.SubFactory(ScenarioSetFactory, owner=factory.SelfAttribute("..owner"))
    config = factory.LazyFunction(dict)
    num_steps = 3


class StepFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Step

    run = factory.SubFactory(RunFactory)
    step = factory.Sequence(lambda n: n + 1)
    reward_mean = 0.5
    reward_std = 0.1
    metrics = factory.LazyFunction(lambda: {"loss": 0.1, "kl": 0.0, "grad_norm": 1.0})


class TrajectoryGroupFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TrajectoryGroup

    run = factory.SubFactory(RunFactory)
    step = 1
    scenario = factory.LazyAttribute(lambda o: o.run.scenario_set.scenarios.first())


class TrajectoryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Trajectory

    group = factory.SubFactory(TrajectoryGroupFactory)
    run = factory.SelfAttribute("group.run")
    step = factory.SelfAttribute("group.step")
    index = factory.Sequence(lambda n: n % 8)
    messages = factory.LazyFunction(
        lambda: [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]
    )
    reward = 1.0
    search_text = "Say hi\nhi"


class CheckpointFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Checkpoint

    run = factory.SubFactory(RunFactory)
    step = factory.Sequence(lambda n: n + 1)
    path = factory.LazyAttribute(lambda o: f"/nonexistent/checkpoints/run-{o.run.id}/step-{o.step}")
