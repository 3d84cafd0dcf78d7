"""Pure, synchronous, deterministic state machines: events in, instructions out.

Nothing here imports asyncio, socket, threading or time, or reads global config:
time enters as a field of an event.
"""
