import pytest

from artweb.testing.factories import (
    BaseModelFactory,
    CheckpointFactory,
    RunFactory,
    StepFactory,
    TrajectoryFactory,
    TrajectoryGroupFactory,
)


@pytest.fixture
def world(alice, bob):
    """One run of each persona's with steps, trajectories and a checkpoint."""
    BaseModelFactory()
    out = {}
    for user in (alice, bob):
        run = RunFactory(owner=user, name=f"{user.username}-run", num_steps=10, tags=["t1"])
        for i in range(1, 4):
            StepFactory(run=run, step=i, reward_mean=0.1 * i)
        group = TrajectoryGroupFactory(run=run, step=2)
        traj = TrajectoryFactory(
            group=group,
            index=0,
            reward=0.75,
            advantage=0.5,
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": f"Question for {user.username}"},
                {
                    "role": "assistant",
                    "content": None,
                    "token_ids": [1, 2, 3],
                    "logprobs": [-0.1, -0.2, -0.3],
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "result-text"},
                {"role": "assistant", "content": "final answer", "token_ids": [4, 5]},
            ],
            error="",
            search_text="final answer",
        )
        checkpoint = CheckpointFactory(run=run, step=3, path=f"/nonexistent/artweb-test/{run.id}/3")
        out[user.username] = {"run": run, "group": group, "traj": traj, "checkpoint": checkpoint}
    return out
