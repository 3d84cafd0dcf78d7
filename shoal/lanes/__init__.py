"""Lanes: a one-task ``get``, or a small graph's, goes from the client straight to a
worker, and the scheduler hears of it after.

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

A small graph goes whole (``LaneRunGraph``), as the same exchange:

* The client decides what may go (``shoal/client/graph/lane_graph.py``): at most 64
  tasks after culling, none annotated, no P2P shuffle, no future in it, no large
  constant, encoded in at most 256 KiB, sent dependencies first in Dask's order.
* The worker takes it only on the same facts as a task, and only when it is short: the
  recent durations of its tasks' prefixes add up to at most
  ``shoal.worker.lane-graphs.expected`` (20 ms); a prefix never measured declines it.
  The scheduler measures every prefix and shares the durations with the workers that
  have lanes (``LaneDurations``, ``shoal/core/scheduler/lanes.py``); the worker's own
  graph runs update them too.
* It runs on the lane thread (``_graph_run.py``) as Dask's synchronous scheduler
  would, and stops between two tasks past ``stop-after`` (100 ms) or holding more than
  ``max-bytes`` of results (``shoal/core/worker/lanes.py``): the client then submits the
  graph through the scheduler, and offers graphs of the same prefixes by lane again
  only after 10 s. Each task that ran is reported; the busy announcement names the
  first.

``shoal.client.lanes: false`` turns lanes off for a client.
"""
