"""MultiLock requests in :class:`~shoal.core.scheduler.coordination.CoordinationState`
(Dask's ``MultiLockExtension``): a request queues on each of its lock names, holds a name
while first in its queue, and is granted once it holds ``num_locks`` of them, leaving
the other queues then. Pure, as the rest of the coordination core."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from shoal.protocol import messages as m

if TYPE_CHECKING:
    from shoal.core.scheduler.coordination import Outcome, Waiter


class MultiRequest:
    """One MultiLock acquire: queued on ``names``; granted once it is first in
    ``num_locks`` of those queues (``left`` counts down)."""

    __slots__ = ("client", "token", "names", "left", "waiter", "granted")

    def __init__(self, client: str, token: str, num_locks: int):
        self.client = client
        self.token = token
        self.names: list[str] = []  # the queues it is in
        self.left = num_locks
        self.waiter: Waiter | None = None
        self.granted = False


class MultiLocks:
    """The MultiLock half of ``CoordinationState`` (a mixin)."""

    multilocks: dict[str, list[MultiRequest]]  # name -> queue (the first holds it)
    multi_requests: dict[str, MultiRequest]  # token -> request

    if TYPE_CHECKING:

        def _park(self, waiter: Waiter, msg: m.Coordinate, now: float, out: Outcome) -> bool: ...

    def _multilock_acquire(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        if msg.token in self.multi_requests:
            error = f"MultiLock request {msg.token!r} is already acquired or waiting"
            out.replies.append((client, m.CoordinateReply(msg.request_id, False, error=error)))
            return
        request = MultiRequest(client, msg.token, int(msg.number))
        self.multi_requests[msg.token] = request
        # The least contended names first, as Dask's: more often granted at once.
        for name in sorted(msg.names, key=lambda n: len(self.multilocks.get(n, ()))):
            queue = self.multilocks.setdefault(name, [])
            queue.append(request)
            request.names.append(name)
            if len(queue) == 1:
                request.left -= 1
                if not request.left:
                    request.granted = True
                    out.replies.append((client, m.CoordinateReply(msg.request_id)))
                    return  # not queued on the rest at all
        from shoal.core.scheduler.coordination import Waiter

        waiter = Waiter(client, msg, math.inf, None)
        waiter.multi = request
        if self._park(waiter, msg, now, out):
            request.waiter = waiter
        else:  # a timeout of 0: gone again
            self._multi_withdraw(request, now, out)

    def _multilock_release(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        request = self.multi_requests.get(msg.token)
        if request is None or request.client != client or not request.granted:
            out.replies.append((client, m.CoordinateReply(msg.request_id, False)))
            return
        self._multi_withdraw(request, now, out)
        out.replies.append((client, m.CoordinateReply(msg.request_id)))

    def _multi_withdraw(self, request: MultiRequest, now: float, out: Outcome) -> None:
        """``request`` leaves every queue it is in; the next in each queue it led
        holds that name now (and is granted if that was the last it needed)."""
        del self.multi_requests[request.token]
        for name in request.names:
            queue = self.multilocks[name]
            if queue[0] is request:
                queue.pop(0)
                if queue:
                    following = queue[0]
                    following.left -= 1
                    if following.left <= 0 and not following.granted:
                        self._multi_grant(following, out)
            else:
                queue.remove(request)
            if not queue:
                del self.multilocks[name]
        request.names = []

    def _multi_grant(self, request: MultiRequest, out: Outcome) -> None:
        request.granted = True
        held = []
        for name in request.names:
            queue = self.multilocks[name]
            if queue[0] is request:
                held.append(name)
            else:  # no longer waited for
                queue.remove(request)
        request.names = held
        waiter = request.waiter
        if waiter is not None and not waiter.done:
            waiter.done = True
            out.replies.append((waiter.client, m.CoordinateReply(waiter.request_id)))
