"""Lanes: a one-task ``get`` goes from the client straight to a worker, and the
scheduler hears of it after.

Why. ``delayed(f)(x).compute()`` is one task, and on a cluster its time is mostly
hops: client -> scheduler -> worker -> scheduler -> client, each handled by a process
that was idle a moment ago and runs cold (PROFILE-interactive.md, section 9). A lane
takes the scheduler off that path, as Ray's direct task submission does: the scheduler
grants the client a *lane* on a worker beforehand, and the client then sends such a
task to that worker itself and reads the answer itself (two hops).

The rules, and where each is decided:

* The scheduler grants lanes and closes them (``shoal/core/scheduler/lanes.py``): only
  on a worker that takes new tasks and has no walltime or task budget; closed when it
  stops taking new tasks (pause, retirement, removal), when its client leaves, and
  while a scheduler plugin watches transitions or graphs.
* The client decides what may go by lane (``_client.py``): a synchronous ``get`` of a
  graph of one task, the key asked for, that depends on nothing, has no retries,
  restrictions, resources, duration or shuffle, whose key this client holds no future
  of, and whose encoding is small. Anything else, and every declined or failed run,
  goes through the scheduler as before.
* The worker decides whether to take it (``shoal/core/worker/lanes.py``): only when
  idle, at most one at a time, and not while paused, leaving, limited or watched by a
  worker plugin. A run that goes on past 50 ms is announced (``LaneBusy``) and counts as
  a busy thread in the scheduler's placement until its report: a long task by lane
  does not make its worker look idle.

A lane changes only the path, never a result: the task has no record on the scheduler
and no future, its value goes back to the caller only, and if the run is declined,
the connection breaks or the worker dies, the client submits the same task through the
scheduler (tasks are pure, as everywhere in Dask: running one twice is safe). The
worker reports its runs (``LaneRan``, those of each 10 ms together, so that the
scheduler is not woken while the client takes its answer) for the task stream and the
tasks' durations.

``shoal.client.lanes: false`` turns lanes off for a client.
"""
