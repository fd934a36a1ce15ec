"""Rollout scripts for the sandbox tests: scenario 0 runs the code under test, scenario 1 is a
well-behaved rollout with reward 1.0, one group each."""

TEMPLATE = """
import art, asyncio, json, os, socket, sys

async def rollout(model, scenario):
    if scenario.i == 0:
{bad}
    return art.Trajectory(messages_and_choices=[{{"role": "user", "content": "hi"}}], reward=1.0)
"""


def script(bad: str) -> str:
    return TEMPLATE.format(bad="\n".join("        " + line for line in bad.splitlines()))
