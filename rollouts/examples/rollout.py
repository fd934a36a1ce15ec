"""Example task: one short sentence about a topic that uses a given word.

Written the way ART's documentation writes rollouts; artweb runs it unchanged. The reward (reward.py)
gives partial credit for using the word and for brevity, so even the untrained model's answers differ
in reward within a group, and GRPO has something to learn from at the first step.
"""

import art

SYSTEM = "You are a concise writer. Answer with a single sentence."


async def rollout(model: art.Model, scenario) -> art.Trajectory:
    client = model.openai_client()
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": scenario.prompt},
    ]
    completion = await client.chat.completions.create(model=model.name, messages=messages)
    choice = completion.choices[0]
    trajectory = art.Trajectory(messages_and_choices=messages, metadata={"word": scenario.word})
    trajectory.messages_and_choices.append(choice)
    return trajectory
