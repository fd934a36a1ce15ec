"""Helpers for the sandbox tests: building requests against the session's vLLM server or none."""

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "rollouts" / "examples"

# An address nothing listens on: for sandbox tests whose scripts never call the model.
NO_SERVER = "http://127.0.0.1:9/v1"


@pytest.fixture
def request_for():
    from rollouts.sandbox.batch import SandboxLimits
    from rollouts.sandbox.rollouts import RolloutRequest

    def build(
        script: str,
        *,
        scenarios=None,
        group_size=2,
        reward=None,
        base_url=NO_SERVER,
        model_name="none",
        rollout_timeout_s=20.0,
        **kwargs,
    ):
        return RolloutRequest(
            script=script,
            reward=reward,
            scenarios=scenarios or [{"i": 0}, {"i": 1}],
            group_size=group_size,
            base_url=base_url,
            model_name=model_name,
            sampling=kwargs.pop("sampling", {"max_tokens": 16}),
            max_exceptions=kwargs.pop("max_exceptions", 100),
            limits=kwargs.pop("limits", SandboxLimits(rollout_timeout_s=rollout_timeout_s)),
            **kwargs,
        )

    return build
