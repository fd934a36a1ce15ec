"""Mirrors of runs in the tools people already use: Weights & Biases, Weave and Langfuse.

The step loop calls `hooks.step_committed` / `hooks.run_finished`; they only enqueue tasks on the
"default" queue. Each task brings one export target up to date with the database (a cursor per target
and run), so a retried or duplicated task repeats nothing and a failing service never touches the run.
"""
