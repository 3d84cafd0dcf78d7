"""Heartbeats to the scheduler, shared by workers and clients.

A peer that is frozen (SIGSTOP, a hung host, a network partition) closes no connection:
only a request left unanswered shows it is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from shoal.comm.connection import CommClosedError, Connection
from shoal.protocol import messages as m


async def keep_alive(
    conn: Connection, beat: Callable[[int], m.Message], timeout: float, interval: float
) -> None:
    """Send ``beat(request_id)`` every ``interval`` seconds (or as the replies say) until
    ``conn`` closes; abort it, with the reason, when a reply takes over ``timeout``."""
    while not conn.closed:
        try:
            reply, _ = await conn.request(beat, timeout=timeout)
        except TimeoutError:
            conn.abort(f"the scheduler did not answer for {timeout}s")
            return
        except CommClosedError:
            return
        if isinstance(reply, m.HeartbeatReply):
            # As the scheduler asks, but often enough for our own timeout to mean
            # something: a silence is noticed within about 1.5 timeouts.
            interval = min(reply.interval, timeout / 2)
        await asyncio.sleep(interval)
