"""The worker's state machine: which task runs, what to fetch and from whom, what to
release, with no I/O.

- ``state``: :class:`WorkerState` (and its tasks, ``WTask``): events in, instructions out;
- ``events``: the events it handles and the instructions it gives;
- ``fetch``: dependencies fetched from peers; ``release``: tasks released and forgotten;
- ``validation``: every invariant, checked in tests after each event.
"""

from shoal.core.worker.state import WorkerState

__all__ = ["WorkerState"]
