"""What the cores hand to plugins: every transition (and worker joining or leaving)
while watched, nothing once unwatched. No network, no threads."""

from __future__ import annotations

from typing import Any

from scheduler_harness import W1, W2, Sim
from test_worker_state import compute, make, ok

from shoal.protocol.messages import LogEvent


def test_scheduler_transitions_reach_the_sink_only_while_watched() -> None:
    sim = Sim()
    seen: list[tuple[Any, ...]] = []
    sim.s.watch_transitions(seen)
    sim.submit({"a": []})
    sim.finish("a")
    path = [(start, finish) for key, start, finish, _ in seen if key == "a"]
    assert path[0] == ("released", "waiting")
    assert path[-1] == ("processing", "memory")
    assert all(isinstance(sid, str) and sid for *_, sid in seen)
    # The story keeps them too, as before.
    assert [e[1:3] for e in sim.s.story("a") if len(e) == 4 and e[0] == "a"] == path

    sim.s.watch_transitions(None)
    n = len(seen)
    sim.submit({"b": []})
    sim.finish("b")
    assert len(seen) == n
    assert ("processing", "memory") in [e[1:3] for e in sim.s.story("b")]


def test_scheduler_queued_fast_path_is_watched_too() -> None:
    sim = Sim(workers={W1: 1})
    seen: list[tuple[Any, ...]] = []
    sim.s.watch_transitions(seen)
    sim.submit({k: [] for k in "uvwxyz"})  # one thread: root tasks queue, then go
    assert sim.s.nqueued  # a few at a time
    while sim.processing():
        sim.finish(sim.processing()[0])
    to_memory = {key for key, _, finish, _ in seen if finish == "memory"}
    assert to_memory == set("uvwxyz")
    assert any(start == "queued" and finish == "processing" for _, start, finish, _ in seen)


def test_worker_joins_and_removals_reach_the_sink() -> None:
    sim = Sim(workers={W1: 1})
    seen: list[tuple[str, str, str]] = []
    sim.s.watch_workers(seen.append)
    sim.add_worker(W2)
    sim.remove_worker(W2, sid="gone")
    sim.remove_worker(W2, sid="again")  # not known any more: nothing to tell
    assert seen == [("add", W2, "add-w"), ("remove", W2, "gone")]
    sim.s.watch_workers(None)
    sim.add_worker(W2)
    assert len(seen) == 2


def test_a_workers_log_event_lands_in_the_event_log_with_its_address() -> None:
    sim = Sim(workers={W1: 1})
    sim.s.tick(1234.5)
    sim.s.handle_worker(W1, LogEvent("plugins", {"plugin": "p", "hook": "setup"}, "e-1"))
    assert sim.s.get_events("plugins") == {
        "plugins": [(1234.5, {"plugin": "p", "hook": "setup", "worker": W1})]
    }


def test_worker_transitions_reach_the_sink_only_while_watched() -> None:
    ws = make()
    seen: list[tuple[Any, ...]] = []
    ws.watch_transitions(seen)
    ws.handle(compute("a", sid="s1"))
    ws.handle(ok("a", sid="done"))
    assert [(k, s, f, sid) for k, s, f, sid in seen] == [
        ("a", "released", "ready", "s1"),
        ("a", "ready", "executing", "s1"),
        ("a", "executing", "memory", "done"),
    ]
    ws.watch_transitions(None)
    ws.handle(compute("b", sid="s2"))
    assert len(seen) == 3
    assert ("b", "ready", "executing", "s2") in ws.story("b")


def test_wake_is_called_each_time_the_sink_stops_being_empty() -> None:
    sim = Sim()
    seen: list[tuple[Any, ...]] = []
    wakes: list[int] = []
    sim.s.watch_transitions(seen, lambda: wakes.append(len(seen)))
    sim.submit({"a": []})
    assert wakes == [0] and len(seen) >= 2  # once for the batch, not per transition
    seen.clear()  # the server took them
    sim.finish("a")
    assert wakes == [0, 0]
