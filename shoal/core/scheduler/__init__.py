"""The scheduler's state machine: every decision the scheduler makes, with no I/O.

- ``state``: :class:`SchedulerState`, the task transitions and the message handlers,
  composed of the mixins below;
- ``submission``: clients' graphs (SubmitTasks), wants, releases and cancels;
- ``model``: the records (tasks, groups, prefixes, workers, clients);
- ``placement``: which worker runs a task (root-task queue, restrictions, slots);
- ``membership``: workers joining, leaving, pausing, retiring;
- ``reports``: what workers tell it (results, errors, copies, missing data);
- ``introspection``, ``progress``: what clients may ask (state, counters, watches);
- ``pins``, ``events``: pins that keep workers, the structured event log;
- ``scaling``, ``adaptive``: which workers to add or close, and the adaptive policy;
- ``validation``: every invariant, checked in tests after each event.
"""

from shoal.core.scheduler.state import SchedulerState

__all__ = ["SchedulerState"]
