import json

import pytest

from training.engine.config import ConfigError, TrainConfig


@pytest.mark.parametrize(
    ("field", "value", "range_text"),
    [
        ("learning_rate", -1e-5, "(0, 1]"),
        ("learning_rate", 0.0, "(0, 1]"),
        ("lora_rank", 0, "[1, 1024]"),
        ("warmup_steps", -1, "[0, 1e+06]"),
        ("loss", "reinforce", "['cispo', 'ppo', 'gspo']"),
        ("backend", "jax", "['peft', 'unsloth']"),
        ("max_grad_norm", -1.0, "[0, 1e+06]"),
        ("lora_dropout", 1.0, "[0, 0.9]"),
        ("epsilon", 0.0, "(0, 1]"),
    ],
)
def test_it_rejects_out_of_range_values_naming_the_field_and_range(field, value, range_text):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**{field: value})
    assert err.value.field == field
    assert field in str(err.value) and range_text in str(err.value)


def test_it_rejects_wrong_types():
    with pytest.raises(ConfigError, match="lora_rank must be an integer"):
        TrainConfig(lora_rank=8.5)
    with pytest.raises(ConfigError, match="scale_rewards must be true or false"):
        TrainConfig(scale_rewards="yes")
    with pytest.raises(ConfigError, match="learning_rate must be a finite number"):
        TrainConfig(learning_rate=float("nan"))
    with pytest.raises(ConfigError, match="lora_target_modules"):
        TrainConfig(lora_target_modules=())


def test_a_decaying_schedule_needs_total_steps():
    with pytest.raises(ConfigError) as err:
        TrainConfig(lr_scheduler="cosine")
    assert err.value.field == "total_steps"
    assert TrainConfig(lr_scheduler="cosine", total_steps=100).total_steps == 100


def test_it_round_trips_through_json():
    cfg = TrainConfig(loss="ppo", epsilon=0.3, lora_target_modules=("q_proj", "v_proj"), total_steps=7)
    again = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.lora_target_modules == ("q_proj", "v_proj")


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_dict({"learning_rate": 1e-5, "lr": 1e-5})
    assert err.value.field == "lr" and "unknown config key" in str(err.value)


def test_clip_range_defaults_follow_the_loss():
    assert TrainConfig().clip_range() == (1.0, 4.0)
    assert TrainConfig(loss="ppo").clip_range() == (0.2, 0.2)
    assert TrainConfig(loss="gspo").clip_range() == (3e-4, 4e-4)
    assert TrainConfig(loss="ppo", epsilon_high=0.28).clip_range() == (0.2, 0.28)
