"""The head-to-head benchmark feeds TRL exactly what an artweb run of the example task sees."""

import pytest

from bench.task import EXAMPLES, load_reward, load_scenarios, messages_for, system_prompt, train_schedule
from rollouts.services import scenario_set_create
from training.config import RunConfig
from training.services.steps.batch import scenarios_sample


@pytest.mark.django_db
def test_the_schedule_is_the_scenarios_each_artweb_step_samples(alice):
    from artweb.testing.factories import RunFactory

    scenario_set = scenario_set_create(owner=alice, name="example", jsonl=(EXAMPLES / "scenarios.jsonl").read_text())
    run = RunFactory(owner=alice, scenario_set=scenario_set, config={"seed": 7})
    cfg = RunConfig.model_validate({"seed": 7, "scenarios_per_step": 4})
    schedule = train_schedule(load_scenarios()["train"], steps=5, per_step=4, seed=7)
    for step, chosen in enumerate(schedule, start=1):
        sampled = scenarios_sample(run, cfg, step, "train", 4)
        assert [s.data["prompt"] for s in sampled] == [s["prompt"] for s in chosen]
    assert len({s["prompt"] for step in schedule for s in step}) > 4  # it varies from step to step


def test_the_prompt_and_reward_are_the_shipped_ones():
    scenarios = load_scenarios()
    assert len(scenarios["train"]) == 48 and sum(len(v) for k, v in scenarios.items() if k != "train") == 12
    ocean = next(s for s in scenarios["train"] if s["word"] == "blue")
    assert messages_for(ocean) == [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": ocean["prompt"]},
    ]
    assert "single sentence" in system_prompt()
    score = load_reward()
    assert score(ocean, "The blue sea is calm.") == 1.0
    assert score(ocean, "The sea is calm.") == 0.5
    assert score(ocean, "") == 0.0
    # Past the word limit the brevity half decays: 25 words against a limit of 10 keeps a quarter of it.
    assert score(ocean, " ".join(["blue"] + ["word"] * 24)) == pytest.approx(0.5 + 0.5 * 0.25)


@pytest.mark.django_db
def test_a_second_checkout_registers_its_own_copy_of_the_default_model(tmp_path, vllm_model_dir):
    from artweb.testing.model_cache import link_model
    from bench.run_curve import _register_model

    first, second = link_model(vllm_model_dir, tmp_path / "a"), link_model(vllm_model_dir, tmp_path / "b")
    a = _register_model(first)
    assert a.name == "SmolLM2-135M-Instruct"
    assert _register_model(first).id == a.id  # the same checkout again: the same row
    b = _register_model(second)
    assert b.id != a.id and b.name.startswith("SmolLM2-135M-Instruct (") and b.source == str(second)
