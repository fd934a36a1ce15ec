"""Example multi-turn agent: answer "what is the capital of X?" by calling a lookup tool first.

The first turn must call the tool (tool_choice names it: the agent is meant to consult it rather
than guess); its result goes back as a tool message, and the second turn answers in words. Every
assistant turn is a Choice appended as returned, so each carries its token ids and logprobs.
The script sets its own reward, so it needs no reward function.
"""

import json

import art

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_capital",
            "description": "Look up the capital city of a country.",
            # strict: the server constrains the call's arguments to this schema, as OpenAI's API does. Without
            # it only the call's envelope is forced, and a small model's arguments ramble on to max_tokens (a
            # call cut off is no call at all). maxLength: a name left open-ended could do the same.
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "country": {"type": "string", "description": "The country's name in English.", "maxLength": 40}
                },
                "required": ["country"],
                "additionalProperties": False,
            },
        },
    }
]


def lookup_capital(country: str, scenario) -> str:
    """The tool: it knows the capital of the scenario's country (tool_scenarios.jsonl beside this script
    holds 60 of them), and of no other."""
    if country.strip().lower() == scenario.country.lower():
        return scenario.capital
    return f"No capital known for {country!r}."


async def rollout(model: art.Model, scenario) -> art.Trajectory:
    client = model.openai_client()
    trajectory = art.Trajectory(
        messages_and_choices=[
            {
                "role": "system",
                "content": "Call lookup_capital with the country's name, then reply with only the capital's name.",
            },
            {"role": "user", "content": f"What is the capital of {scenario.country}?"},
        ],
        tools=TOOLS,
    )
    tool_calls = 0
    for turn in range(2):
        completion = await client.chat.completions.create(
            model=model.name,
            messages=trajectory.messages(),
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "lookup_capital"}} if turn == 0 else "none",
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        for call in choice.message.tool_calls or []:
            tool_calls += 1
            try:
                result = lookup_capital(str(json.loads(call.function.arguments).get("country", "")), scenario)
            except (ValueError, AttributeError):
                result = "The arguments were not a JSON object with a country."
            trajectory.messages_and_choices.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if not choice.message.tool_calls:
            break
    answer = trajectory.messages()[-1]["content"] or ""
    trajectory.metrics["tool_calls"] = tool_calls
    trajectory.reward = 0.2 * (tool_calls > 0) + 0.8 * (scenario.capital.lower() in answer.lower())
    return trajectory
