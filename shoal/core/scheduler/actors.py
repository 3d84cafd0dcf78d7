"""Actors in the scheduler core (a mixin of :class:`~shoal.core.scheduler.SchedulerState`):
a task whose result is a stateful object that stays on its worker. The scheduler only
keeps its worker: while an actor's key is in memory, its worker is pinned (owner
``actor:<key>``), so retirement refuses it and no scale-down picks it. The pin goes when
the key leaves memory (released, forgotten) or the worker dies (pins drop dead workers).
Calls to the actor go from clients to that worker directly, never through here."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from shoal.protocol import messages as m
from shoal.protocol.messages import Key

ACTOR_REASON = "holds an actor"


class Actors:
    if TYPE_CHECKING:
        from shoal.core.scheduler.model import ClientRecord, TaskState
        from shoal.core.scheduler.pins import PinRecord

        tasks: dict[Key, TaskState]
        pin_owner_kinds: dict[str, Callable[[str], bool]]

        def add_pin(
            self,
            workers: Iterable[str],
            reason: str,
            owner: str,
            lease: float | None,
            stimulus_id: str,
        ) -> PinRecord: ...
        def release_pins_of(self, owner: str, stimulus_id: str, why: str) -> None: ...

    def _init_actors(self) -> None:
        self.actor_keys: dict[str, Key] = {}  # the pin owner's id ("actor:<id>") -> key
        self._actor_ids: dict[Key, str] = {}
        self.pin_owner_kinds["actor"] = self._actor_alive

    def _actor_alive(self, ident: str) -> bool:
        key = self.actor_keys.get(ident)
        ts = self.tasks.get(key) if key is not None else None
        return ts is not None and ts.state == "memory"

    def _register_actor(self, cs: ClientRecord, msg: m.RegisterActor) -> None:
        for key in msg.keys:
            ts = self.tasks.get(key)
            if ts is None or key in self._actor_ids:
                continue
            ident = repr(key)
            self.actor_keys[ident] = key
            self._actor_ids[key] = ident
            if ts.state == "memory":  # it finished before this message came
                self._pin_actor(ts, msg.stimulus_id or f"actor-{cs.id}")

    def _pin_actor(self, ts: TaskState, stimulus_id: str) -> None:
        workers = [ws.address for ws in ts.who_has]
        if workers:
            owner = f"actor:{self._actor_ids[ts.key]}"
            self.add_pin(workers, ACTOR_REASON, owner, None, stimulus_id)

    def _actor_transition(self, ts: TaskState, start: str, stimulus_id: str) -> None:
        """Called after ``ts`` (an actor's key) left ``start``."""
        ident = self._actor_ids[ts.key]
        if ts.state == "memory":
            self._pin_actor(ts, stimulus_id)
        elif start == "memory":
            self.release_pins_of(f"actor:{ident}", stimulus_id, "the actor was released")
        if ts.state == "forgotten":
            del self._actor_ids[ts.key]
            del self.actor_keys[ident]
