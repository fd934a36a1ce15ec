"""Using what a run trained: the OpenAI-compatible endpoint, checkpoint aliases, the playground and answer
diffs, and the serving thread of the GPU workers. A Django app of its own (label "serving").

It depends on training (runs, checkpoints, the worker's inference server and its serving gate), and
nothing in training imports it (tests/artweb/test_architecture.py).

- `protocol`: how a request travels from the web process to a worker's serving thread and back (Redis).
- `selectors`: which model a name means for a user, and the user's serving jobs.
- `services`: the web side of a request (`serving`), aliases, playground sessions and diffs (`serve_jobs`).
- `worker`: the serving thread of a GPU worker (artweb.celery starts it).
"""
