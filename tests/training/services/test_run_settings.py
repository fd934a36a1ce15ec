"""Settings a run stores are settings it applies: the run's seed seeds the trainer, a base model's chat
template override reaches the inference server's command line and the trainer's tokenization, and the
group size is the run's alone (the training settings have none).

The vLLM server is not started here (minutes on two CPU cores): its start is replaced by a no-op and
the test reads the command line it would run. The trainer is real, on a tiny random-weight model.
"""

from pathlib import Path

import pytest
import torch

from artweb.errors import ApplicationError
from artweb.testing.factories import BaseModelFactory, RunFactory
from rollouts.inference.vllm_server import TOOLS_TEMPLATE, VLLMServer
from tests.training.engine.conftest import (  # noqa: F401 - fixtures of the engine tests, used here too
    default_model_dir,
    tiny_model_dir,
    tokenizer,
    trajectory,
)
from training.config import run_config_parse
from training.engine.config import ConfigError, TrainConfig
from training.engine.tokenize import tokenize_trajectory
from training.services import inference

pytestmark = pytest.mark.django_db

OVERRIDE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} OVERRIDDEN\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(autouse=True)
def worker(settings, tmp_path, monkeypatch):
    """A worker with its own data directory, the CPU trainer, and vLLM servers that are never started."""
    settings.DATA_DIR = tmp_path
    settings.ARTWEB = {
        **settings.ARTWEB,
        "TRAINER_BACKEND": "peft",
        "DEVICE": "cpu",
        "VLLM_PYTHON": "python3",
        "INFERENCE_ENGINE": "vllm",
    }
    monkeypatch.setattr(VLLMServer, "start", lambda self, *a, **k: None)
    monkeypatch.setattr(VLLMServer, "ensure_running", lambda self: None)
    yield
    inference.shutdown()


def _lora(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


# --- seed ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_it_seeds_the_trainer_with_the_runs_seed(tiny_model_dir):  # noqa: F811 - a fixture
    model = BaseModelFactory(name="tiny", local_path=str(tiny_model_dir))
    weights = []
    for seed in (7, 7, 8):
        run = RunFactory(base_model=model, config=run_config_parse({"seed": seed}).model_dump())
        weights.append(_lora(inference.trainer_for(run, checkpoint_dir=None)))
        inference.trainer_close()
    same, other = weights[1], weights[2]
    assert weights[0].keys() == same.keys() and weights[0]
    assert all(torch.equal(weights[0][n], same[n]) for n in same)
    assert any(not torch.equal(weights[0][n], other[n]) for n in other)


def test_it_keeps_one_seed_and_one_group_size_per_run():
    cfg = run_config_parse({"seed": 3, "group_size": 4})
    assert "seed" not in cfg.train and "group_size" not in cfg.train
    for key, points_to in (("seed", "the run's `seed`"), ("group_size", "the run's `group_size`")):
        with pytest.raises(ConfigError, match=points_to) as err:
            TrainConfig.from_dict({key: 4})
        assert err.value.field == key
        with pytest.raises(ApplicationError) as app_err:
            run_config_parse({"train": {key: 4}})
        assert points_to in str(app_err.value.field_errors["train"])


def test_it_drops_the_moved_keys_from_stored_configs():
    import importlib

    from django.apps import apps

    migration = importlib.import_module("training.migrations.0003_run_config_train_moved_keys")
    old = RunFactory(config={"seed": 5, "train": {"learning_rate": 1e-5, "seed": 0, "group_size": 8}})
    new = RunFactory(config={"seed": 5, "train": {"learning_rate": 1e-5}})
    migration.drop_moved_keys(apps, None)
    old.refresh_from_db()
    new.refresh_from_db()
    assert old.config == new.config == {"seed": 5, "train": {"learning_rate": 1e-5}}


# --- chat template override ----------------------------------------------------------------------------


def test_it_starts_vllm_with_the_models_chat_template_override(tiny_model_dir, tmp_path):  # noqa: F811
    plain = BaseModelFactory(name="tiny", local_path=str(tiny_model_dir))
    custom = BaseModelFactory(name="tiny-custom", local_path=str(tiny_model_dir), chat_template_override=OVERRIDE)

    server = inference.inference_server(custom)
    command = server.command()
    path = Path(command[command.index("--chat-template") + 1])
    assert path.read_text() == OVERRIDE and path.is_relative_to(tmp_path)
    assert inference.inference_server(custom) is server  # the same model: the same server

    # Same weights, the model's own template: another server. This tiny model's own template cannot
    # render tools, so it gets artweb's tools template, named for the trainer too.
    other = inference.inference_server(plain)
    assert other is not server
    command = other.command()
    assert command[command.index("--chat-template") + 1] == str(TOOLS_TEMPLATE)


def test_it_tokenizes_with_the_models_chat_template_override(tiny_model_dir, tokenizer):  # noqa: F811
    custom = BaseModelFactory(name="tiny-custom", local_path=str(tiny_model_dir), chat_template_override=OVERRIDE)
    run = RunFactory(base_model=custom)
    trainer = inference.trainer_for(run, checkpoint_dir=None)
    assert trainer.tokenizer.chat_template == OVERRIDE

    seq = tokenize_trajectory(trainer.tokenizer, trajectory(tokenizer, "Say hi.", "hi", 1.0), max_seq_len=256)
    rendered = tokenizer.decode(seq.input_ids)
    assert "<|im_start|>user OVERRIDDEN\nSay hi." in rendered
    # The sampled answer is still exactly the sampler's tokens, marked trainable.
    assert tokenizer.decode([t for t, on in zip(seq.input_ids, seq.trainable, strict=False) if on]).startswith("hi")


def test_it_tokenizes_with_the_template_vllm_falls_back_to(tiny_model_dir):  # noqa: F811
    run = RunFactory(base_model=BaseModelFactory(name="tiny", local_path=str(tiny_model_dir)))
    trainer = inference.trainer_for(run, checkpoint_dir=None)
    assert trainer.tokenizer.chat_template == TOOLS_TEMPLATE.read_text()


def test_the_trainers_objects_are_kept_out_of_collections_while_it_lives(tiny_model_dir):  # noqa: F811
    """The model's object graph is frozen with the trainer (a full collection over it cost ~0.35 s a step)
    and given back to the collector when the trainer goes."""
    import gc

    inference.trainer_close()
    assert gc.get_freeze_count() == 0
    run = RunFactory(base_model=BaseModelFactory(name="tiny", local_path=str(tiny_model_dir)))
    inference.trainer_for(run, checkpoint_dir=None)
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # the model, its tokenizer and what they loaded
    gc.collect()
    # A collection leaves them be. (A frozen object whose last reference goes still leaves the count:
    # a run of the full suite saw 120 of ~850,000 go here.)
    assert gc.get_freeze_count() > 0.99 * frozen
    inference.trainer_close()
    assert gc.get_freeze_count() == 0
