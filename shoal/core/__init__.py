"""Pure, synchronous, deterministic state machines: events in, instructions out.

Nothing here imports asyncio, socket, threading or time, or reads global config:
time enters as a field of an event.

- ``scheduler/``: the scheduler's state machine;
- ``worker/``: the worker's state machine;
- ``comm``, ``story``, ``errors``: what both use (the Comm interface the scheduler
  writes to, the transition log, the errors of invalid states and transitions).
"""
