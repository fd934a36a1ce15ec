"""Reward of the throughput benchmark (bench.gpu_shapes), in [0, 1]: the share of an answer's characters
that are ASCII letters.

A random-weight model answers with noise, which the example task's reward scores alike (no word used, far
too long), so every group would have zero advantages and nothing would be trained. This score differs from
one noisy answer to the next, so every group trains, as it would with a real model and a real reward.
"""


def reward(trajectory, scenario) -> float:
    answer = trajectory.messages()[-1]["content"] or ""
    if not answer:
        return 0.0
    return sum(c.isascii() and c.isalpha() for c in answer) / len(answer)
