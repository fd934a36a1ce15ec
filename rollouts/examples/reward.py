"""Reward for the example task, in [0, 1]: half for using the word, half for staying within the length.

The length part decays linearly past the limit, reaching 0 at three times the limit, so a slightly
long answer still earns something: rewards vary within a group from the first step.
"""

import re

WORD = re.compile(r"[A-Za-z']+")


def reward(trajectory, scenario) -> float:
    answer = trajectory.messages()[-1]["content"] or ""
    words = WORD.findall(answer)
    if not words:
        return 0.0
    used_word = scenario.word.lower() in {w.lower().strip("'") for w in words}
    limit = scenario.max_words
    brevity = 1.0 if len(words) <= limit else max(0.0, 1.0 - (len(words) - limit) / (2 * limit))
    trajectory.metrics.update(used_word=used_word, words=len(words), brevity=round(brevity, 3))
    return 0.5 * used_word + 0.5 * brevity
