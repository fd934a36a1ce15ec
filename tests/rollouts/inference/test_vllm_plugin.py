"""artweb's vLLM plugin: registered where vLLM looks for it, and strict about its setting.
(What it changes in a running server: test_vllm.py::test_the_cpu_builds_engine_does_not_spin_after_a_batch.)"""

from importlib.metadata import entry_points

import pytest

from rollouts.inference.vllm_plugin import busy_loop_seconds


def test_vllm_finds_the_plugin():
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("artweb") == "rollouts.inference.vllm_plugin:register"


@pytest.mark.parametrize("value, seconds", [("0.05", 0.05), ("0", 0.0), (" 2 ", 2.0)])
def test_it_reads_seconds(value, seconds):
    assert busy_loop_seconds(value) == seconds


@pytest.mark.parametrize("value", ["fast", "-1", "nan", "inf"])
def test_it_says_what_to_set_instead(value):
    with pytest.raises(ValueError, match=r"ARTWEB_VLLM_BUSY_LOOP_S must be a number of seconds, 0 or more"):
        busy_loop_seconds(value)
