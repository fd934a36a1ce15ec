"""One job model for the work done in the background: runs, dry runs, re-scores and serve jobs.

- models: the abstract BackgroundJob (status, the worker's lease, dispatched_at, error, timestamps) and
  JobEvent (a timeline row per change) that each kind's models extend;
- kinds: JobKind, what the machinery knows of each kind (its task, claimable and working statuses,
  its lease, what recovery does), declared next to the kind's service;
- leases: the worker's name, the heartbeat and its thread;
- services: claim, transition, finish, fail, dispatched, enqueue and the recovery of stale jobs, each a
  conditional UPDATE with its event row in one transaction.

The sweep (training.sweeper) loops over the kinds: it sends the messages owed to queued jobs and recovers
stale ones, of every kind the same way.
"""
