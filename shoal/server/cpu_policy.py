"""A worker process runs under Linux's ``SCHED_BATCH`` policy (``--batch-scheduling``).

On a machine with fewer free cores than busy processes (a laptop running a client, a
scheduler and a worker per core), the kernel decides at every wake-up who runs. Under
the default policy a worker's thread that wakes up preempts whatever runs on that core:
the scheduler in the middle of placing a graph, the client between two messages, or the
worker's own task thread, which holds the GIL the woken thread then waits for (a
thread switch and back, for nothing). ``SCHED_BATCH`` changes only that: a woken batch
thread waits for the running one's time slice to end, or for a free core; its share of
the CPU (its nice weight) stays as it was. So the scheduler and the client, the latency
of every compute, come first, and a worker's loop and task threads stop preempting each
other. On a node with a core free for each busy thread it changes nothing.

Measured (benchmarks/packing_ab.py ``--rule worker-batch``, PROFILE-interactive.md
section 9): per ``x.mean(axis=0)`` of 400 chunks, each worker's involuntary context
switches fell from about 250 to 30-70 and its voluntary ones by half; the interactive
cells took 2-18% less time.
"""

from __future__ import annotations

import contextlib
import os


def use_batch_scheduling() -> bool:
    """Put every thread of this process, and so every thread it starts later (they
    inherit it), under ``SCHED_BATCH``. False where the platform has no such policy or
    the kernel refuses it (the process then runs as before)."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return False
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # the calling thread
    done = False
    for tid in threads:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile; a refusal
            os.sched_setscheduler(tid, policy, os.sched_param(0))
            done = True
    return done
