"""What a run's stored steps say about it, read after the fact: the scenario × step heatmap, reward health,
the alert rules, re-scoring with another reward function, and the learning-signal figures a step records.

It depends on the rest of training (models, selectors, services) and not the other way round, except for
the three recorders a step calls as it commits: `learning_signals` (pure figures over its rollouts),
`heatmap.heatmap_columns_record` and `alerts.run_alerts_check` (tests/artweb/test_architecture.py).
"""
