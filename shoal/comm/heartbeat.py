"""Heartbeats to the scheduler, shared by workers and clients.

A peer that is frozen (SIGSTOP, a hung host, a network partition) closes no connection:
only a request left unanswered shows it is gone.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from shoal.comm.connection import CommClosedError, Connection
from shoal.protocol import messages as m


async def keep_alive(
    conn: Connection, beat: Callable[[int], m.Message], timeout: float, interval: float
) -> None:
    """Send ``beat(request_id)`` every ``interval`` seconds (or as the replies say) until
    ``conn`` closes; abort it, with the reason, when a reply takes over ``timeout``.

    Only one beat in every ``timeout / 4`` seconds asks for a reply; the others carry
    request id 0, which the scheduler does not answer: an idle scheduler's cost is its
    messages, and a reply is a write per beat. A silent scheduler is still noticed
    within about 1.25 timeouts."""
    loop = asyncio.get_running_loop()
    asked = -math.inf
    while not conn.closed:
        now = loop.time()
        if now - asked < timeout / 4:
            conn.send(beat(0))
        else:
            asked = now
            try:
                reply, _ = await conn.request(beat, timeout=timeout)
            except TimeoutError:
                conn.abort(f"the scheduler did not answer for {timeout}s")
                return
            except CommClosedError:
                return
            if isinstance(reply, m.HeartbeatReply):
                # As the scheduler asks, but often enough for our own timeout to mean
                # something.
                interval = min(reply.interval, timeout / 2)
        await asyncio.sleep(interval)
