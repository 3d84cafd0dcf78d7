"""Coordination primitives held by the scheduler: locks, semaphores, events, variables,
queues and publish/subscribe topics. Pure: requests in, instructions out.

:class:`CoordinationState` answers each :class:`~shoal.protocol.messages.Coordinate`
request at once or parks it as a *waiter* (an acquire on a full semaphore, a get on an
empty queue, a wait on a clear event); a later request, the holder's departure or the
waiter's deadline (``expire(now)``, wall clock) answers it. Everything it decides comes
back as an :class:`Outcome`: the replies to send, and the keys the primitives start or
stop holding (a future stored in a Variable or a Queue keeps its data alive) or hand to
a client that got one.

Values are opaque bytes (the scheduler never unpickles them) or a task key. Leases,
waiters and subscriptions belong to the client that made them (a task's requests come
from its worker's client), and go when that client leaves: no lease outlives its holder.
Queues, variables, events and topics belong to the cluster, as in Dask.

A Lock is a semaphore with one lease, in its own namespace. As in Dask, a lease may
carry a timeout (``distributed.scheduler.locks.lease-timeout``, sent by the client):
its holder refreshes it (``refresh``) well within that time; a lease not refreshed for
longer is released (its holder stalled, or lost touch), and the next waiter granted.

A MultiLock request (Dask's ``MultiLockExtension``) queues on each of its names; it
holds a name while first in that name's queue, and is granted once it holds
``num_locks`` of them, giving up its places in the other queues then.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from shoal.core.scheduler.multilock import MultiLocks, MultiRequest
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

Item = tuple[bytes | None, Key | None]  # (pickled value, None) or (None, a task key)

KINDS = ("lock", "semaphore", "multilock", "event", "variable", "queue", "pubsub")
OPS = {
    "lock": ("acquire", "release", "value", "refresh"),
    "semaphore": ("acquire", "release", "value", "refresh"),
    "multilock": ("acquire", "release"),
    "event": ("set", "clear", "is_set", "wait"),
    "variable": ("set", "get", "delete"),
    "queue": ("create", "put", "get", "qsize"),
    "pubsub": ("subscribe", "unsubscribe", "publish", "get"),
}

NEEDS_TOKEN = {  # a lease's or a subscription's id, chosen by the client
    "lock": ("acquire", "release", "refresh"),
    "semaphore": ("acquire", "release", "refresh"),
    "multilock": ("acquire", "release"),
    "pubsub": ("subscribe", "unsubscribe", "get"),
}


class Outcome:
    """What the scheduler must do after a request: send ``replies`` (client id, reply),
    want the keys of ``hold`` for the primitives and release those of ``drop`` (each
    listed when the primitives' count of it goes 0 -> 1 or 1 -> 0), and make each
    client of ``give`` want its key (it got a future out of a primitive)."""

    __slots__ = ("replies", "hold", "drop", "give")

    def __init__(self) -> None:
        self.replies: list[tuple[str, m.CoordinateReply]] = []
        self.hold: list[Key] = []
        self.drop: list[Key] = []
        self.give: list[tuple[str, Key]] = []

    def __bool__(self) -> bool:
        return bool(self.replies or self.hold or self.drop or self.give)


class Waiter:
    """A parked request, answered once (``done``) by a grant, a timeout or its
    client leaving."""

    __slots__ = (
        "client",
        "request_id",
        "deadline",
        "token",
        "number",
        "item",
        "done",
        "got",
        "home",
        "multi",
    )

    def __init__(self, client: str, msg: m.Coordinate, deadline: float, item: Item | None):
        self.client = client
        self.request_id = msg.request_id
        self.deadline = deadline
        self.token = msg.token
        self.number = msg.number
        self.item = item  # the value a blocked put waits to append
        self.done = False
        # A batch get takes items as they come: those taken so far, and their queue
        # (where they go back if the get times out or its client leaves).
        self.got: list[Item] = []
        self.home: Queue | None = None
        self.multi: MultiRequest | None = None  # a MultiLock acquire's request


class Semaphore:
    __slots__ = ("where", "max_leases", "leases", "waiters", "lease_timeout", "refreshed")

    def __init__(self, where: tuple[str, str], max_leases: int, lease_timeout: float | None = None):
        self.where = where  # (kind, name)
        self.max_leases = max_leases
        self.leases: dict[str, str] = {}  # lease token -> holder client id
        self.waiters: deque[Waiter] = deque()
        self.lease_timeout = lease_timeout  # None: leases live until released
        self.refreshed: dict[str, float] = {}  # lease token -> when granted or refreshed


class Event:
    __slots__ = ("flag", "waiters")

    def __init__(self) -> None:
        self.flag = False
        self.waiters: list[Waiter] = []


class Variable:
    __slots__ = ("item", "waiters")

    def __init__(self) -> None:
        self.item: Item | None = None
        self.waiters: list[Waiter] = []


class Queue:
    __slots__ = ("maxsize", "items", "getters", "putters")

    def __init__(self, maxsize: int):
        self.maxsize = maxsize  # 0: unbounded
        self.items: deque[Item] = deque()
        self.getters: deque[Waiter] = deque()
        self.putters: deque[Waiter] = deque()


class Subscription:
    __slots__ = ("client", "topic", "items", "getters")

    def __init__(self, client: str, topic: str):
        self.client = client
        self.topic = topic
        self.items: deque[Item] = deque()
        self.getters: deque[Waiter] = deque()


def _reply(waiter: Waiter | m.Coordinate, **fields: Any) -> m.CoordinateReply:
    return m.CoordinateReply(waiter.request_id, **fields)


class CoordinationState(MultiLocks):
    def __init__(self) -> None:
        self.semaphores: dict[tuple[str, str], Semaphore] = {}  # (kind, name)
        self.events: dict[str, Event] = {}
        self.variables: dict[str, Variable] = {}
        self.queues: dict[str, Queue] = {}
        self.subscriptions: dict[str, Subscription] = {}  # token -> subscription
        self.topics: dict[str, dict[str, Subscription]] = {}  # topic -> token -> sub
        self.key_refs: dict[Key, int] = {}  # how many places in primitives hold each key
        self.multilocks: dict[str, list[MultiRequest]] = {}  # name -> queue (first holds)
        self.multi_requests: dict[str, MultiRequest] = {}  # token -> request
        self._deadlines: list[tuple[float, int, Waiter]] = []
        # When leases may have expired: (due, seq, (kind, name), token); an entry is
        # checked when due, and pushed again if its lease was refreshed since.
        self._lease_checks: list[tuple[float, int, tuple[str, str], str]] = []
        self._seq = itertools.count()
        self.expired_leases = 0  # leases released because their holder stopped refreshing

    # ------------------------------------------------------------------ entry points

    def handle(self, client: str, msg: m.Coordinate, now: float) -> Outcome:
        """Apply one request of ``client`` at wall-clock time ``now``."""
        out = Outcome()
        error = self._check(msg)
        if error:
            out.replies.append((client, _reply(msg, ok=False, error=error)))
            return out
        getattr(self, f"_{msg.kind}_{msg.op}")(client, msg, now, out)
        return out

    def expire(self, now: float) -> Outcome:
        """Answer (``ok=False``) the waiters whose deadline is ``now`` or earlier, and
        release the leases not refreshed within their timeout."""
        out = Outcome()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, waiter = heapq.heappop(self._deadlines)
            if not waiter.done:
                waiter.done = True
                self._give_back(waiter)
                out.replies.append((waiter.client, _reply(waiter, ok=False, timed_out=True)))
                if waiter.multi is not None:
                    self._multi_withdraw(waiter.multi, now, out)
        if out.replies:
            self._prune_waiters()
        while self._lease_checks and self._lease_checks[0][0] <= now:
            _, _, where, token = heapq.heappop(self._lease_checks)
            sem = self.semaphores.get(where)
            if sem is None or token not in sem.leases or sem.lease_timeout is None:
                continue  # released meanwhile
            due = sem.refreshed[token] + sem.lease_timeout
            if due > now:  # refreshed since: checked again then
                heapq.heappush(self._lease_checks, (due, next(self._seq), where, token))
                continue
            del sem.leases[token]
            del sem.refreshed[token]
            self.expired_leases += 1
            self._grant(sem, now, out)
        return out

    def next_deadline(self) -> float:
        """The earliest deadline of a waiter still waiting or of a lease (inf: none)."""
        while self._deadlines and self._deadlines[0][2].done:
            heapq.heappop(self._deadlines)
        waiter = self._deadlines[0][0] if self._deadlines else math.inf
        lease = self._lease_checks[0][0] if self._lease_checks else math.inf
        return min(waiter, lease)

    def remove_client(self, client: str, now: float = 0.0) -> Outcome:
        """``client`` left: its leases are released (waiters granted in its place),
        its waiters, MultiLock requests and subscriptions dropped."""
        out = Outcome()
        for request in [r for r in self.multi_requests.values() if r.client == client]:
            if request.waiter is not None:
                request.waiter.done = True
            self._multi_withdraw(request, now, out)
        for sem in self.semaphores.values():
            for w in sem.waiters:
                if w.client == client:
                    w.done = True
        for waiters in self._all_waiter_lists():
            for w in waiters:
                if w.client == client and not w.done:
                    w.done = True
                    self._give_back(w)
        for token in [t for t, s in self.subscriptions.items() if s.client == client]:
            self._unsubscribe(token, out)
        for sem in self.semaphores.values():
            gone = [token for token, holder in sem.leases.items() if holder == client]
            for token in gone:
                del sem.leases[token]
                sem.refreshed.pop(token, None)
            if gone:
                self._grant(sem, now, out)
        self._prune_waiters()
        return out

    # ------------------------------------------------------------------ checks

    def _check(self, msg: m.Coordinate) -> str:
        ops = OPS.get(msg.kind)
        if ops is None:
            return f"unknown coordination primitive {msg.kind!r} (one of {', '.join(KINDS)})"
        if msg.op not in ops:
            return f"a {msg.kind} has no operation {msg.op!r} (one of {', '.join(ops)})"
        if not isinstance(msg.name, str) or not msg.name:
            return f"a {msg.kind}'s name is a non-empty str, not {msg.name!r}"
        if msg.timeout is not None and not msg.timeout >= 0:
            return f"a timeout is a number of seconds >= 0 or None, not {msg.timeout!r}"
        if msg.op in NEEDS_TOKEN.get(msg.kind, ()) and not msg.token:
            return f"a {msg.kind} {msg.op} needs a token (a lease's or a subscription's)"
        if msg.kind in ("lock", "semaphore") and msg.op == "acquire" and msg.number < 1:
            return f"a semaphore's max_leases is >= 1, not {msg.number}"
        if msg.lease_timeout is not None and not msg.lease_timeout > 0:
            return f"a lease timeout is a number of seconds > 0 or None, not {msg.lease_timeout!r}"
        if msg.kind == "multilock" and msg.op == "acquire":
            names = msg.names
            if not names or not all(isinstance(n, str) and n for n in names):
                return f"a MultiLock needs non-empty lock names, not {names!r}"
            if len(set(names)) != len(names):
                return f"a MultiLock's lock names are distinct, not {names!r}"
            if not 1 <= msg.number <= len(names):
                return f"num_locks is between 1 and {len(names)} (the names), not {msg.number}"
        if msg.kind == "queue" and msg.op == "create" and msg.number < 0:
            return f"a queue's maxsize is >= 0, not {msg.number}"
        if msg.kind == "pubsub" and msg.op == "get" and msg.token not in self.subscriptions:
            return f"no subscription {msg.token!r} to topic {msg.name!r}"
        return ""

    # ------------------------------------------------------------------ helpers

    def _park(self, waiter: Waiter, msg: m.Coordinate, now: float, out: Outcome) -> bool:
        """Whether ``waiter`` may wait: a timeout of 0 answers ``ok=False`` now."""
        if msg.timeout == 0:
            out.replies.append((waiter.client, _reply(msg, ok=False, timed_out=True)))
            return False
        if msg.timeout is not None:
            waiter.deadline = now + msg.timeout
            heapq.heappush(self._deadlines, (waiter.deadline, next(self._seq), waiter))
        return True

    def _give_back(self, waiter: Waiter) -> None:
        """A batch get that will not complete returns what it took, in order."""
        if waiter.got and waiter.home is not None:
            waiter.home.items.extendleft(reversed(waiter.got))
            waiter.got = []

    def _hold(self, item: Item, out: Outcome) -> None:
        key = item[1]
        if key is not None:
            n = self.key_refs.get(key, 0)
            self.key_refs[key] = n + 1
            if n == 0:
                out.hold.append(key)

    def _drop(self, item: Item, out: Outcome) -> None:
        key = item[1]
        if key is not None:
            n = self.key_refs[key] - 1
            if n:
                self.key_refs[key] = n
            else:
                del self.key_refs[key]
                out.drop.append(key)

    def _hand(self, to: Waiter | m.Coordinate, client: str, item: Item, out: Outcome) -> None:
        """Answer with one item; a client getting a key is made to want it."""
        if item[1] is not None:
            out.give.append((client, item[1]))
        out.replies.append((client, _reply(to, value=item[0], key=item[1])))

    def _hand_batch(
        self, to: Waiter | m.Coordinate, client: str, items: list[Item], out: Outcome
    ) -> None:
        """Answer with a list of items (a batch get), maybe empty."""
        for _, key in items:
            if key is not None:
                out.give.append((client, key))
        out.replies.append((client, _reply(to, items=list(items), number=len(items))))

    def _all_waiter_lists(self) -> Iterable[Iterable[Waiter]]:
        for ev in self.events.values():
            yield ev.waiters
        for var in self.variables.values():
            yield var.waiters
        for q in self.queues.values():
            yield q.getters
            yield q.putters
        for sub in self.subscriptions.values():
            yield sub.getters

    def _prune_waiters(self) -> None:
        for sem in self.semaphores.values():
            sem.waiters = deque(w for w in sem.waiters if not w.done)
        for ev in self.events.values():
            ev.waiters = [w for w in ev.waiters if not w.done]
        for var in self.variables.values():
            var.waiters = [w for w in var.waiters if not w.done]
        for q in self.queues.values():
            q.getters = deque(w for w in q.getters if not w.done)
            q.putters = deque(w for w in q.putters if not w.done)
        for sub in self.subscriptions.values():
            sub.getters = deque(w for w in sub.getters if not w.done)

    # ------------------------------------------------------------------ semaphores, locks

    def _semaphore(self, msg: m.Coordinate) -> Semaphore | None:
        return self.semaphores.get((msg.kind, msg.name))

    def _semaphore_acquire(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        max_leases = 1 if msg.kind == "lock" else int(msg.number)
        sem = self.semaphores.get((msg.kind, msg.name))
        if sem is None:  # the first acquire's lease timeout stays, as Dask's registration
            sem = Semaphore((msg.kind, msg.name), max_leases, msg.lease_timeout)
            self.semaphores[(msg.kind, msg.name)] = sem
        if sem.max_leases != max_leases:
            error = (
                f"semaphore {msg.name!r} has max_leases={sem.max_leases}, "
                f"not {max_leases}: every instance of one name must agree"
            )
            out.replies.append((client, _reply(msg, ok=False, error=error)))
            return
        if msg.token in sem.leases:
            error = f"lease {msg.token!r} of {msg.kind} {msg.name!r} is already held"
            out.replies.append((client, _reply(msg, ok=False, error=error)))
            return
        waiter = Waiter(client, msg, math.inf, None)
        if len(sem.leases) < sem.max_leases and not sem.waiters:
            self._lease(sem, msg.token, client, now)
            out.replies.append((client, _reply(msg)))
        elif self._park(waiter, msg, now, out):
            sem.waiters.append(waiter)

    def _semaphore_release(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        sem = self._semaphore(msg)
        if sem is None or sem.leases.get(msg.token) != client:
            out.replies.append((client, _reply(msg, ok=False)))
            return
        del sem.leases[msg.token]
        sem.refreshed.pop(msg.token, None)
        out.replies.append((client, _reply(msg)))
        self._grant(sem, now, out)

    def _semaphore_refresh(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        """The holder is alive: its lease lives another ``lease_timeout`` (ok=False for
        a lease it no longer holds: released, or expired)."""
        sem = self._semaphore(msg)
        if sem is None or sem.leases.get(msg.token) != client:
            out.replies.append((client, _reply(msg, ok=False)))
            return
        sem.refreshed[msg.token] = now
        out.replies.append((client, _reply(msg)))

    def _lease(self, sem: Semaphore, token: str, client: str, now: float) -> None:
        sem.leases[token] = client
        sem.refreshed[token] = now
        if sem.lease_timeout is not None:
            due = now + sem.lease_timeout
            heapq.heappush(self._lease_checks, (due, next(self._seq), sem.where, token))

    def _semaphore_value(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        sem = self._semaphore(msg)
        out.replies.append((client, _reply(msg, number=len(sem.leases) if sem else 0)))

    def _grant(self, sem: Semaphore, now: float, out: Outcome) -> None:
        while sem.waiters and len(sem.leases) < sem.max_leases:
            waiter = sem.waiters.popleft()
            if waiter.done:
                continue
            waiter.done = True
            self._lease(sem, waiter.token, waiter.client, now)
            out.replies.append((waiter.client, _reply(waiter)))

    _lock_acquire = _semaphore_acquire
    _lock_release = _semaphore_release
    _lock_value = _semaphore_value
    _lock_refresh = _semaphore_refresh

    # ------------------------------------------------------------------ events

    def _event_set(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        ev = self.events.setdefault(msg.name, Event())
        ev.flag = True
        for waiter in ev.waiters:
            if not waiter.done:
                waiter.done = True
                out.replies.append((waiter.client, _reply(waiter)))
        ev.waiters = []
        out.replies.append((client, _reply(msg)))

    def _event_clear(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        ev = self.events.get(msg.name)
        if ev is not None:
            ev.flag = False
        out.replies.append((client, _reply(msg)))

    def _event_is_set(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        ev = self.events.get(msg.name)
        out.replies.append((client, _reply(msg, ok=ev is not None and ev.flag)))

    def _event_wait(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        ev = self.events.setdefault(msg.name, Event())
        if ev.flag:
            out.replies.append((client, _reply(msg)))
            return
        waiter = Waiter(client, msg, math.inf, None)
        if self._park(waiter, msg, now, out):
            ev.waiters.append(waiter)

    # ------------------------------------------------------------------ variables

    def _variable_set(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        var = self.variables.setdefault(msg.name, Variable())
        item: Item = (msg.value, msg.key)
        self._hold(item, out)
        if var.item is not None:
            self._drop(var.item, out)
        var.item = item
        for waiter in var.waiters:
            if not waiter.done:
                waiter.done = True
                self._hand(waiter, waiter.client, item, out)
        var.waiters = []
        out.replies.append((client, _reply(msg)))

    def _variable_get(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        var = self.variables.setdefault(msg.name, Variable())
        if var.item is not None:
            self._hand(msg, client, var.item, out)
            return
        waiter = Waiter(client, msg, math.inf, None)
        if self._park(waiter, msg, now, out):
            var.waiters.append(waiter)

    def _variable_delete(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        var = self.variables.get(msg.name)
        if var is not None and var.item is not None:
            self._drop(var.item, out)
            var.item = None
        if var is not None and not var.waiters:
            del self.variables[msg.name]
        out.replies.append((client, _reply(msg)))

    # ------------------------------------------------------------------ queues

    def _queue(self, name: str, maxsize: int = 0) -> Queue:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = Queue(maxsize)
        return q

    def _queue_create(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        q = self._queue(msg.name, int(msg.number))  # the first maxsize stays, as in Dask
        out.replies.append((client, _reply(msg, number=q.maxsize)))

    def _queue_put(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        q = self._queue(msg.name)
        item: Item = (msg.value, msg.key)
        if q.maxsize and len(q.items) >= q.maxsize:
            waiter = Waiter(client, msg, math.inf, item)
            if self._park(waiter, msg, now, out):
                q.putters.append(waiter)
            return
        self._hold(item, out)
        q.items.append(item)
        out.replies.append((client, _reply(msg)))
        self._serve_queue(q, out)

    def _queue_get(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        """``number`` 0: one item; -1: every item there is now (maybe none); n > 0:
        n items, waiting for them."""
        q = self._queue(msg.name)
        if msg.number < 0:
            items = list(q.items)
            q.items.clear()
            self._hand_batch(msg, client, items, out)
            for item in items:
                self._drop(item, out)
            self._serve_queue(q, out)
            return
        waiter = Waiter(client, msg, math.inf, None)
        waiter.home = q
        want = max(1, int(msg.number))
        must_wait = bool(q.getters) or len(q.items) < want
        if must_wait and not self._park(waiter, msg, now, out):
            return  # a timeout of 0
        q.getters.append(waiter)
        self._serve_queue(q, out)

    def _queue_qsize(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        q = self.queues.get(msg.name)
        out.replies.append((client, _reply(msg, number=len(q.items) if q else 0)))

    def _serve_queue(self, q: Queue, out: Outcome) -> None:
        """Move blocked puts in while there is room, and hand items to getters in
        order while there are enough, until neither can move."""
        while True:
            moved = False
            while q.putters and (not q.maxsize or len(q.items) < q.maxsize):
                putter = q.putters.popleft()
                if putter.done:
                    continue
                putter.done = True
                assert putter.item is not None
                self._hold(putter.item, out)
                q.items.append(putter.item)
                out.replies.append((putter.client, _reply(putter)))
                moved = True
            while q.getters and q.getters[0].done:
                q.getters.popleft()
            if q.getters and q.items:  # the first getter takes what it still needs
                getter = q.getters[0]
                need = max(1, int(getter.number)) - len(getter.got)
                while need and q.items:
                    getter.got.append(q.items.popleft())
                    need -= 1
                moved = True
                if not need:
                    q.getters.popleft()
                    getter.done = True
                    items, getter.got = getter.got, []
                    if getter.number == 0:
                        self._hand(getter, getter.client, items[0], out)
                    else:  # a batch: always a list
                        self._hand_batch(getter, getter.client, items, out)
                    for item in items:
                        self._drop(item, out)
            if not moved:
                return

    # ------------------------------------------------------------------ publish/subscribe

    def _pubsub_subscribe(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        if msg.token in self.subscriptions:
            error = f"subscription token {msg.token!r} is in use"
            out.replies.append((client, _reply(msg, ok=False, error=error)))
            return
        sub = Subscription(client, msg.name)
        self.subscriptions[msg.token] = sub
        self.topics.setdefault(msg.name, {})[msg.token] = sub
        out.replies.append((client, _reply(msg)))

    def _pubsub_unsubscribe(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        sub = self.subscriptions.get(msg.token)
        if sub is not None and sub.client == client:
            self._unsubscribe(msg.token, out)
        out.replies.append((client, _reply(msg)))

    def _unsubscribe(self, token: str, out: Outcome) -> None:
        sub = self.subscriptions.pop(token)
        for getter in sub.getters:
            getter.done = True
        for item in sub.items:
            self._drop(item, out)
        subs = self.topics[sub.topic]
        del subs[token]
        if not subs:
            del self.topics[sub.topic]

    def _pubsub_publish(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        """Every current subscriber of the topic gets the message (later subscribers
        do not); with none, it is dropped, as in Dask."""
        item: Item = (msg.value, msg.key)
        subs = self.topics.get(msg.name, {})
        for sub in subs.values():
            self._hold(item, out)
            sub.items.append(item)
            self._serve_subscription(sub, out)
        out.replies.append((client, _reply(msg, number=len(subs))))

    def _pubsub_get(self, client: str, msg: m.Coordinate, now: float, out: Outcome) -> None:
        sub = self.subscriptions[msg.token]
        if msg.number < 0:  # every message there is now
            items = list(sub.items)
            sub.items.clear()
            self._hand_batch(msg, client, items, out)
            for item in items:
                self._drop(item, out)
            return
        waiter = Waiter(client, msg, math.inf, None)
        if sub.items and not sub.getters:
            sub.getters.append(waiter)
            self._serve_subscription(sub, out)
        elif self._park(waiter, msg, now, out):
            sub.getters.append(waiter)

    def _serve_subscription(self, sub: Subscription, out: Outcome) -> None:
        while sub.items and sub.getters:
            getter = sub.getters.popleft()
            if getter.done:
                continue
            getter.done = True
            item = sub.items.popleft()
            self._hand(getter, getter.client, item, out)
            self._drop(item, out)

    # ------------------------------------------------------------------ introspection

    def leases_of(self, client: str) -> list[tuple[str, str, str]]:
        """(kind, name, token) of every lease ``client`` holds."""
        return [
            (kind, name, token)
            for (kind, name), sem in self.semaphores.items()
            for token, holder in sem.leases.items()
            if holder == client
        ]


# ---------------------------------------------------------------------- the scheduler's side


class Coordination:
    """The coordination primitives in :class:`~shoal.core.scheduler.SchedulerState`:
    carries out :class:`CoordinationState`'s outcomes on tasks and clients. The keys
    the primitives hold are wanted by ``coordination_holder``, a client record of the
    scheduler's own (never connected)."""

    if TYPE_CHECKING:
        from shoal.core.comm import Comm
        from shoal.core.scheduler.model import ClientRecord, TaskState

        comm: Comm
        clients: dict[str, ClientRecord]
        tasks: dict[Key, TaskState]
        wall_time: float

        def _want(self, cs: ClientRecord, ts: TaskState, stimulus_id: str) -> None: ...
        def _release_wants(
            self, cs: ClientRecord, tasks: Iterable[TaskState], stimulus_id: str
        ) -> None: ...
        def _transitions(self, recs: dict[TaskState, str], stimulus_id: str) -> None: ...

    def _init_coordination(self) -> None:
        from shoal.core.scheduler.model import ClientRecord

        self.coordination = CoordinationState()
        self.coordination_holder = ClientRecord("scheduler-coordination")

    def _coordinate(self, cs: Any, msg: m.Coordinate) -> None:
        if msg.key is not None and msg.key not in self.tasks:
            error = f"cannot store future {msg.key!r}: the scheduler does not know it"
            self.comm.send_client(cs.id, m.CoordinateReply(msg.request_id, False, error=error))
            return
        out = self.coordination.handle(cs.id, msg, self.wall_time)
        self._carry_out(out, msg.stimulus_id or f"coordinate-{cs.id}-{msg.request_id}")

    def expire_coordination(self, now: float, stimulus_id: str) -> None:
        """Time out the waiters whose deadline passed (the server ticks at deadlines)."""
        if self.coordination.next_deadline() <= now:
            self._carry_out(self.coordination.expire(now), stimulus_id)

    def _coordination_client_left(self, client_id: str, stimulus_id: str) -> None:
        out = self.coordination.remove_client(client_id, self.wall_time)
        self._carry_out(out, stimulus_id)

    def _carry_out(self, out: Outcome, stimulus_id: str) -> None:
        # Wants first: a key moving from a queue to a client is never unwanted between.
        recs: dict[Any, str] = {}
        for client_id, key in out.give:
            cs = self.clients.get(client_id)
            ts = self.tasks.get(key)
            if cs is not None and ts is not None:
                self._want(cs, ts, stimulus_id)
                if ts.state == "released":
                    recs[ts] = "waiting"
        holder = self.coordination_holder
        for key in out.hold:
            ts = self.tasks.get(key)
            if ts is not None:
                self._want(holder, ts, stimulus_id)
                if ts.state == "released":
                    recs[ts] = "waiting"
        if recs:
            self._transitions(recs, stimulus_id)
        dropped = [ts for key in out.drop if (ts := self.tasks.get(key)) is not None]
        if dropped:
            self._release_wants(holder, dropped, stimulus_id)
        for client_id, reply in out.replies:
            self.comm.send_client(client_id, reply)
