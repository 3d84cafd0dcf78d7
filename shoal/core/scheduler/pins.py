"""Pins: workers kept alive for state that lives on them (a mixin of
:class:`~shoal.core.scheduler.SchedulerState`, like membership).

A pin holds one or more workers for a reason and an owner: a client
(``"client:<client_id>"``) or a scheduler-side owner such as a shuffle
(``"shuffle:<id>"``; any ``"kind:id"``). While a pin holds a worker, retirement refuses
it (unless asked to ignore pins) and no scale-down may pick it (``is_pinned``).

No pin outlives its owner or its workers: a client's pins go when it leaves, a worker
that is removed is dropped from every pin (a pin left with no worker goes), and a pin
with a lease expires unless renewed. Every change is logged to the "pins" topic.

Leases are measured on the core's wall clock (``wall_time``, set by ``tick``), the
clock event timestamps use too, so ``expires`` reads as a time of day.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from shoal.core.comm import Comm
from shoal.core.scheduler.model import ClientRecord, WorkerRecord
from shoal.protocol import messages as m

PINS_TOPIC = "pins"


class PinRecord:
    __slots__ = ("id", "workers", "reason", "owner", "lease", "expires")

    def __init__(
        self,
        pin_id: int,
        workers: tuple[str, ...],
        reason: str,
        owner: str,
        lease: float | None,
        expires: float | None,
    ):
        self.id = pin_id
        self.workers = workers  # addresses
        self.reason = reason
        self.owner = owner  # "kind:id", e.g. "client:client-1-x" or "shuffle:3"
        self.lease = lease  # seconds a renewal buys; None: held until released
        self.expires = expires  # absolute, on the core's wall clock; None: never

    def __repr__(self) -> str:
        return f"<Pin {self.id} {self.workers} {self.reason!r} owner={self.owner}>"


def owner_kind(owner: str) -> tuple[str, str]:
    """``"client:abc"`` -> ``("client", "abc")``; ValueError for anything else."""
    kind, sep, ident = owner.partition(":") if isinstance(owner, str) else ("", "", "")
    if not sep or not kind or not ident:
        raise ValueError(f"a pin's owner is 'kind:id' (e.g. 'client:<id>'), not {owner!r}")
    return kind, ident


class Pins:
    """Pin methods and state of :class:`~shoal.core.scheduler.SchedulerState`."""

    workers: dict[str, WorkerRecord]
    clients: dict[str, ClientRecord]
    comm: Comm
    wall_time: float

    if TYPE_CHECKING:

        def _find_worker(self, name: str) -> WorkerRecord | None: ...
        def log_event(self, topic: str, data: dict[str, Any]) -> None: ...

    def _init_pins(self) -> None:
        self.pins: dict[int, PinRecord] = {}
        self._pin_ids = itertools.count(1)
        self._pins_by_owner: dict[str, set[int]] = {}
        # The earliest time a lease may run out (inf: none may): ticks before it cost
        # one comparison, however many pins there are.
        self._next_pin_expiry = math.inf
        # How to tell that an owner of each kind is still alive ("client": connected).
        # Other owners (a shuffle extension) register theirs; the invariants use them.
        self.pin_owner_kinds: dict[str, Callable[[str], bool]] = {
            "client": lambda ident: ident in self.clients
        }

    # ------------------------------------------------------------------ the API

    def add_pin(
        self,
        workers: Iterable[str],
        reason: str,
        owner: str,
        lease: float | None,
        stimulus_id: str,
    ) -> PinRecord:
        """Pin ``workers`` (addresses or names) for ``owner``. ValueError, naming the
        problem, for an unknown or retiring worker, no workers, a lease that is not a
        positive number of seconds, or an owner that is malformed or already gone."""
        if isinstance(workers, str):
            workers = [workers]
        kind, ident = owner_kind(owner)
        alive = self.pin_owner_kinds.get(kind)
        if alive is not None and not alive(ident):
            raise ValueError(f"cannot pin for {owner}: it is gone")
        if lease is not None and (
            isinstance(lease, bool) or not isinstance(lease, int | float) or not lease > 0
        ):
            raise ValueError(f"a pin's lease is a positive number of seconds, not {lease!r}")
        addresses: dict[str, None] = {}
        for name in workers:
            ws = self._find_worker(name) if isinstance(name, str) else None
            if ws is None:
                raise ValueError(f"cannot pin {name!r}: no such worker")
            if ws.status == "retiring":
                raise ValueError(f"cannot pin {name!r}: the worker is retiring")
            addresses[ws.address] = None
        if not addresses:
            raise ValueError("a pin needs at least one worker")
        expires = None if lease is None else self.wall_time + lease
        pin = PinRecord(next(self._pin_ids), tuple(addresses), reason, owner, lease, expires)
        self.pins[pin.id] = pin
        self._pins_by_owner.setdefault(owner, set()).add(pin.id)
        for address in pin.workers:
            self.workers[address].pins.add(pin.id)
        if expires is not None:
            self._next_pin_expiry = min(self._next_pin_expiry, expires)
        self.log_event(
            PINS_TOPIC,
            {
                "action": "pin",
                "pin": pin.id,
                "workers": list(pin.workers),
                "reason": reason,
                "owner": owner,
                "lease": lease,
                "stimulus_id": stimulus_id,
            },
        )
        return pin

    def release_pin(self, pin_id: int, stimulus_id: str, why: str = "released") -> bool:
        """Release a pin; False (and nothing done) if it is already gone."""
        pin = self.pins.pop(pin_id, None)
        if pin is None:
            return False
        for address in pin.workers:
            self.workers[address].pins.discard(pin_id)
        owned = self._pins_by_owner.get(pin.owner)
        if owned is not None:
            owned.discard(pin_id)
            if not owned:
                del self._pins_by_owner[pin.owner]
        self.log_event(
            PINS_TOPIC,
            {
                "action": "unpin",
                "pin": pin_id,
                "workers": list(pin.workers),
                "reason": pin.reason,
                "owner": pin.owner,
                "why": why,
                "stimulus_id": stimulus_id,
            },
        )
        return True

    def renew_pin(self, pin_id: int, stimulus_id: str) -> bool:
        """Restart a pin's lease from now; False if the pin is gone (expired too)."""
        pin = self.pins.get(pin_id)
        if pin is None:
            return False
        if pin.lease is not None:
            pin.expires = self.wall_time + pin.lease
        return True

    def release_pins_of(self, owner: str, stimulus_id: str, why: str) -> None:
        """Release every pin ``owner`` holds (it finished, failed or left)."""
        for pin_id in sorted(self._pins_by_owner.get(owner, ())):
            self.release_pin(pin_id, stimulus_id, why)

    def is_pinned(self, address: str) -> bool:
        ws = self.workers.get(address)
        return ws is not None and bool(ws.pins)

    def expire_pins(self, now: float, stimulus_id: str) -> None:
        """Release the pins whose lease ran out by ``now`` (wall clock)."""
        if now < self._next_pin_expiry:
            return
        expired = [p for p in self.pins.values() if p.expires is not None and p.expires <= now]
        for pin in expired:
            self.release_pin(pin.id, stimulus_id, f"lease of {pin.lease}s expired")
        self._next_pin_expiry = min(
            (p.expires for p in self.pins.values() if p.expires is not None), default=math.inf
        )

    def pins_of(self, address: str) -> list[PinRecord]:
        ws = self.workers.get(address)
        return [self.pins[i] for i in sorted(ws.pins)] if ws is not None else []

    def pinned_why(self, ws: WorkerRecord) -> str:
        """Why ``ws`` may not be retired: its pins' reasons and owners."""
        return "; ".join(f"pinned: {p.reason} (owner {p.owner})" for p in self.pins_of(ws.address))

    # ------------------------------------------------------------------ hooks

    def _unpin_worker(self, ws: WorkerRecord, stimulus_id: str, why: str) -> None:
        """``ws`` leaves (it died, or retires ignoring pins): drop it from every pin;
        a pin left with no worker goes."""
        for pin_id in sorted(ws.pins):
            pin = self.pins[pin_id]
            pin.workers = tuple(a for a in pin.workers if a != ws.address)
            self.log_event(
                PINS_TOPIC,
                {
                    "action": "worker-gone",
                    "pin": pin_id,
                    "worker": ws.address,
                    "owner": pin.owner,
                    "why": why,
                    "stimulus_id": stimulus_id,
                },
            )
            if not pin.workers:
                self.release_pin(pin_id, stimulus_id, f"its last worker left: {why}")
        ws.pins.clear()

    # ------------------------------------------------------------------ client requests

    def _pin_workers(self, cs: ClientRecord, msg: m.PinWorkers) -> None:
        sid = msg.stimulus_id or f"pin-{cs.id}-{msg.request_id}"
        try:
            pin = self.add_pin(msg.workers, msg.reason, f"client:{cs.id}", msg.lease, sid)
        except ValueError as e:
            self.comm.send_client(cs.id, m.PinReply(msg.request_id, error=str(e)))
            return
        reply = m.PinReply(msg.request_id, pin.id, list(pin.workers), pin.expires)
        self.comm.send_client(cs.id, reply)

    def _pin_change(self, cs: ClientRecord, msg: m.ReleasePin | m.RenewPin) -> None:
        """A client releases or renews one of its own pins (answered ``done=False`` if
        the pin is gone already: releasing twice is no error)."""
        sid = msg.stimulus_id or f"pin-{cs.id}-{msg.request_id}"
        pin = self.pins.get(msg.pin_id)
        if pin is None:
            reply = m.PinReply(msg.request_id, msg.pin_id, done=False)
        elif pin.owner != f"client:{cs.id}":
            error = f"pin {msg.pin_id} belongs to {pin.owner}, not to this client"
            reply = m.PinReply(msg.request_id, msg.pin_id, error=error)
        elif type(msg) is m.ReleasePin:
            self.release_pin(pin.id, sid, "released by its client")
            reply = m.PinReply(msg.request_id, pin.id, list(pin.workers))
        else:
            self.renew_pin(pin.id, sid)
            reply = m.PinReply(msg.request_id, pin.id, list(pin.workers), pin.expires)
        self.comm.send_client(cs.id, reply)
