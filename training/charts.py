"""The run's charts, in one place: the run page draws them (in this order, in two sections), the compare
page draws one per entry, and the metrics API and the charts' first data default to their series.

id: the chart's element id suffix (chart-<id>, compare-<id>); series: the Step figure it plots (a Step
column, or a key of Step.metrics or Step.timings); label: what a screen reader says; band: reward_std
drawn around it; markers: points, for a series measured only some steps; signal: in the Learning
signal section.
"""

from __future__ import annotations

RUN_CHARTS: tuple[dict, ...] = (
    {
        "id": "reward",
        "title": "Reward (mean ± std)",
        "series": "reward_mean",
        "band": True,
        "label": "Reward mean with standard deviation band",
    },
    {"id": "val", "title": "Validation reward", "series": "val_reward", "markers": True, "label": "Validation reward"},
    {"id": "loss", "title": "Loss", "series": "loss", "label": "Loss"},
    {"id": "kl", "title": "KL divergence", "series": "kl", "label": "KL divergence"},
    {"id": "grad", "title": "Gradient norm", "series": "grad_norm", "label": "Gradient norm"},
    {
        "id": "len",
        "title": "Completion length (tokens)",
        "series": "completion_tokens_mean",
        "label": "Completion length",
    },
    {"id": "tps", "title": "Tokens per second", "series": "tokens_per_second", "label": "Tokens per second"},
    {"id": "time", "title": "Step time (s)", "series": "duration_s", "label": "Step time"},
    # The learning-signal monitor (training/analytics/learning_signals.py computes them at each step): is there anything to
    # learn from, and is the policy still exploring?
    {
        "id": "dead",
        "title": "Dead groups (share with all rewards equal)",
        "series": "dead_group_share",
        "signal": True,
        "label": "Share of dead groups",
    },
    {
        "id": "effective",
        "title": "Effective batch (trajectories with an advantage)",
        "series": "effective_batch",
        "signal": True,
        "label": "Effective batch",
    },
    {
        "id": "adv",
        "title": "Advantage spread (std)",
        "series": "advantage_std",
        "signal": True,
        "label": "Advantage spread",
    },
    {
        "id": "mismatch",
        "title": "Sampler/trainer log-prob mismatch (KL)",
        "series": "sampler_kl",
        "signal": True,
        "label": "Sampler and trainer log-prob mismatch",
    },
    {
        "id": "trunc",
        "title": "Truncated at max_tokens (share)",
        "series": "truncation_rate",
        "signal": True,
        "label": "Truncation rate",
    },
    {"id": "entropy", "title": "Token entropy", "series": "entropy", "signal": True, "label": "Token entropy"},
)

# The series the charts plot, with reward_std (the reward chart's band) after reward_mean.
DEFAULT_SERIES: tuple[str, ...] = tuple(
    dict.fromkeys(name for c in RUN_CHARTS for name in (c["series"], *(("reward_std",) if c.get("band") else ())))
)

# The decimals a chart's values keep, in the first paint and in a live step's points alike.
POINT_DIGITS = 6
