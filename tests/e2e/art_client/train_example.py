"""An ART training script as an ART user writes it, run by ART's own client (openpipe-art from PyPI, in an
environment of its own: artweb.testing.art_client). The one line an ART user changes to train on artweb
is the backend's: `art.ServerlessBackend(api_key=<artweb API token>, base_url=<artweb>/api/v1/art)`.

The task: answer a short prompt; the longer the answer, the higher the reward (the default model's
answers vary in length, so a group's rewards differ and GRPO has something to compare).

What it is told comes from the environment:
  ART_EXAMPLE_MODEL        the model's name (its project is "artweb-e2e")
  ART_EXAMPLE_BASE_MODEL   the base model, as artweb names it
  ART_EXAMPLE_STEPS        how many training steps to run (default 2)
  ART_EXAMPLE_API          "backend": `backend.train(model, groups, ...)` (ART 0.5.18);
                           "model": `model.train(groups, config=art.TrainConfig(...))` (ART 0.5.17)
  ART_EXAMPLE_BAD_GROUP    "1": first post the first batch with its second group cut to one trajectory
  ART_EXAMPLE_HOLD         a file: before the last training step, say "holding" and wait for it to exist
  ART_EXAMPLE_DELETE       "1": after the steps, delete every checkpoint but the latest (and best)

It prints one JSON object a line of what it saw, for the test that runs it to check; an exception that
ends it is printed last as {"event": "raised", ...} and the script exits with 1.
"""

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import art

PROMPTS = ["Name a fruit.", "Say something about the sea."]
GROUP_SIZE = 3


def say(event: str, **data) -> None:
    print(json.dumps({"event": event, **data}), flush=True)


async def rollout(model: art.TrainableModel, prompt: str) -> art.Trajectory:
    client = model.openai_client()
    messages = [
        {"role": "system", "content": "You answer in a few words."},
        {"role": "user", "content": prompt},
    ]
    completion = await client.chat.completions.create(
        model=model.get_inference_name(),
        messages=messages,
        max_tokens=16,
        temperature=1.0,
        logprobs=True,
    )
    choice = completion.choices[0]
    answer = choice.message.content or ""
    return art.Trajectory(
        messages_and_choices=[*messages, choice],
        reward=min(len(answer), 80) / 80,
        metadata={"prompt": prompt},
        metrics={"chars": len(answer)},
    )


async def gather(model: art.TrainableModel, prompts: list[str]) -> list[art.TrajectoryGroup]:
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(model, prompt) for _ in range(GROUP_SIZE)) for prompt in prompts),
        pbar_desc="gather",
    )
    say(
        "rollouts",
        groups=len(groups),
        trajectories=sum(len(g.trajectories) for g in groups),
        rewards=[[t.reward for t in g.trajectories] for g in groups],
        with_logprobs=sum(
            1
            for g in groups
            for t in g.trajectories
            for item in t.messages_and_choices
            if not isinstance(item, dict) and item.logprobs is not None and item.logprobs.content
        ),
    )
    return groups


async def train(model, backend, groups, api: str) -> None:
    if api == "model":
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-4))
        say("trained", step=await model.get_step())
        return
    result = await backend.train(model, groups, learning_rate=1e-4)
    await model.log(groups, metrics=result.metrics, step=result.step, split="train")
    say("trained", step=result.step, metrics=result.metrics)


async def main() -> None:
    model = art.TrainableModel(
        name=os.environ["ART_EXAMPLE_MODEL"],
        project="artweb-e2e",
        base_model=os.environ["ART_EXAMPLE_BASE_MODEL"],
    )
    backend = art.ServerlessBackend(api_key=os.environ["ARTWEB_API_TOKEN"], base_url=os.environ["ARTWEB_ART_URL"])
    await model.register(backend)
    say("registered", id=model.id, run_id=model.run_id, entity=model.entity, inference_name=model.get_inference_name())
    say("step", step=await model.get_step())

    api = os.environ.get("ART_EXAMPLE_API", "backend")
    steps = int(os.environ.get("ART_EXAMPLE_STEPS", "2"))
    for i in range(steps):
        groups = await gather(model, PROMPTS)
        if i == 0 and os.environ.get("ART_EXAMPLE_BAD_GROUP") == "1":
            bad = [groups[0], art.TrajectoryGroup(groups[1].trajectories[:1]), *groups[2:]]
            try:
                await train(model, backend, bad, api)
            except Exception as exc:  # refused: the script goes on with the whole groups
                say("refused", type=type(exc).__name__, message=str(exc))
        if (hold := os.environ.get("ART_EXAMPLE_HOLD")) and i == steps - 1:
            say("holding")
            while not Path(hold).exists():
                time.sleep(0.1)
        await train(model, backend, groups, api)
    say("step", step=await model.get_step())

    if os.environ.get("ART_EXAMPLE_DELETE") == "1":
        await model.delete_checkpoints()
        say("deleted", step=await model.get_step())


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as exc:
        say("raised", type=type(exc).__name__, message=str(exc))
        sys.exit(1)
