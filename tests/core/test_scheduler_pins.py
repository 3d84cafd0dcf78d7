"""Pins on workers, in the scheduler core with simulated time: who may hold them, how
they go (released, expired, their owner or their workers gone), and retirement."""

from __future__ import annotations

import math

import pytest
from scheduler_harness import W1, W2, W3, Sim

from shoal.protocol.messages import (
    CloseWorker,
    PinReply,
    PinWorkers,
    ReleasePin,
    RenewPin,
    RetireReply,
    RetireWorkers,
)


def sim3() -> Sim:
    sim = Sim(workers={W1: 1, W2: 1, W3: 1}, clients=("c", "d"))
    sim.s.tick(1000.0)
    return sim


def pin_events(sim: Sim) -> list[dict]:
    return [data for _, data in sim.s.events.get("pins")]


def replies(sim: Sim, client: str = "c") -> list[PinReply]:
    return [msg for msg in sim.to_client(client) if isinstance(msg, PinReply)]


# --- the core API ------------------------------------------------------------------------


def test_add_and_release():
    sim = sim3()
    s = sim.s
    pin = s.add_pin([W1, "w2:1"], "shuffle", "client:c", None, "p1")  # an address, a name
    assert pin.workers == (W1, W2) and pin.reason == "shuffle" and pin.owner == "client:c"
    assert pin.lease is None and pin.expires is None
    assert s.pins == {pin.id: pin}
    assert sim.ws(W1).pins == {pin.id} == sim.ws(W2).pins and sim.ws(W3).pins == set()
    assert s.is_pinned(W1) and s.is_pinned(W2) and not s.is_pinned(W3)
    assert not s.is_pinned("tcp://nowhere:1")
    s.validate_state()
    assert s.release_pin(pin.id, "r1") is True
    assert s.pins == {} and not s.is_pinned(W1) and not s.is_pinned(W2)
    assert s.release_pin(pin.id, "r2") is False  # twice: a no-op
    assert s.renew_pin(pin.id, "r3") is False
    s.validate_state()
    events = pin_events(sim)
    assert [e["action"] for e in events] == ["pin", "unpin"]
    assert events[0] == {
        "action": "pin",
        "pin": pin.id,
        "workers": [W1, W2],
        "reason": "shuffle",
        "owner": "client:c",
        "lease": None,
        "stimulus_id": "p1",
    }
    assert events[1]["why"] == "released" and events[1]["stimulus_id"] == "r1"
    assert all(ts == 1000.0 for ts, _ in s.events.get("pins"))


def test_a_worker_named_twice_is_pinned_once_and_pins_stack():
    sim = sim3()
    s = sim.s
    a = s.add_pin([W1, W1, "w1:1"], "a", "client:c", None, "p1")
    b = s.add_pin(W1, "b", "shuffle:7", None, "p2")  # one worker, as a str
    assert a.workers == (W1,) == b.workers and a.id != b.id
    assert sim.ws(W1).pins == {a.id, b.id}
    s.release_pin(a.id, "r")
    assert s.is_pinned(W1)  # b still holds it
    s.release_pin(b.id, "r")
    assert not s.is_pinned(W1)


def test_lease_expires_on_tick_unless_renewed():
    sim = sim3()
    s = sim.s
    pin = s.add_pin([W1], "state", "client:c", 10.0, "p1")
    assert pin.expires == 1010.0 and pin.lease == 10.0
    s.tick(1009.0)
    assert pin.id in s.pins
    s.tick(1005.0)  # the wall clock went back: renewals count from it
    assert s.renew_pin(pin.id, "renew") is True
    assert pin.expires == 1015.0
    s.tick(1012.0)
    assert pin.id in s.pins
    s.tick(1015.0)
    assert s.pins == {} and not s.is_pinned(W1)
    assert s.renew_pin(pin.id, "late") is False
    last = pin_events(sim)[-1]
    assert last["action"] == "unpin" and "expired" in last["why"]
    assert s.events.get("pins")[-1][0] == 1015.0  # stamped with the tick that expired it


def test_only_expired_leases_go():
    sim = sim3()
    s = sim.s
    short = s.add_pin([W1], "short", "client:c", 1.0, "p1")
    long = s.add_pin([W1], "long", "client:c", 100.0, "p2")
    forever = s.add_pin([W2], "forever", "client:d", None, "p3")
    s.tick(1001.5)
    assert set(s.pins) == {long.id, forever.id} and short.id not in sim.ws(W1).pins
    s.tick(1099.0)
    assert set(s.pins) == {long.id, forever.id}
    s.tick(10_000.0)
    assert set(s.pins) == {forever.id}


def test_renewing_a_pin_without_lease_changes_nothing():
    sim = sim3()
    pin = sim.s.add_pin([W1], "x", "client:c", None, "p")
    sim.s.tick(10**9)
    assert sim.s.renew_pin(pin.id, "renew") is True
    assert pin.expires is None and pin.id in sim.s.pins


def test_client_leaving_releases_its_pins_only():
    sim = sim3()
    s = sim.s
    mine = s.add_pin([W1, W2], "mine", "client:c", None, "p1")
    other = s.add_pin([W1], "other", "client:d", None, "p2")
    shuffle = s.add_pin([W2], "shuffle", "shuffle:1", None, "p3")
    s.remove_client("c", "bye")
    assert set(s.pins) == {other.id, shuffle.id}
    assert sim.ws(W1).pins == {other.id} and sim.ws(W2).pins == {shuffle.id}
    gone = [e for e in pin_events(sim) if e["action"] == "unpin"]
    assert [(e["pin"], e["why"]) for e in gone] == [(mine.id, "its client left")]
    s.release_pins_of("shuffle:1", "done", "shuffle finished")
    assert set(s.pins) == {other.id}
    assert pin_events(sim)[-1]["why"] == "shuffle finished"
    s.release_pins_of("shuffle:1", "again", "twice")  # nothing left: a no-op
    assert set(s.pins) == {other.id}


def test_a_pin_cannot_be_made_for_a_gone_client():
    sim = sim3()
    with pytest.raises(ValueError, match="client:nobody"):
        sim.s.add_pin([W1], "x", "client:nobody", None, "p")
    assert sim.s.pins == {} and not sim.s.is_pinned(W1)


def test_registered_owner_kinds_are_checked():
    sim = sim3()
    s = sim.s
    alive = {"1"}
    s.pin_owner_kinds["shuffle"] = lambda ident: ident in alive
    pin = s.add_pin([W1], "p2p", "shuffle:1", None, "p")
    with pytest.raises(ValueError, match="shuffle:2"):
        s.add_pin([W1], "p2p", "shuffle:2", None, "p")
    alive.clear()  # the owner went without releasing: the invariants catch it
    with pytest.raises(Exception, match="outlived its owner"):
        s.validate_state()
    s.release_pins_of("shuffle:1", "gone", "shuffle forgotten")
    assert pin.id not in s.pins
    s.validate_state()


def test_a_pinned_worker_that_dies_takes_its_pins():
    sim = sim3()
    s = sim.s
    both = s.add_pin([W1, W2], "both", "client:c", None, "p1")
    one = s.add_pin([W1], "one", "client:c", None, "p2")
    sim.remove_worker(W1, "died")
    assert set(s.pins) == {both.id} and both.workers == (W2,)
    assert sim.ws(W2).pins == {both.id}
    sim.remove_worker(W2, "died-too")
    assert s.pins == {}
    actions = [(e["action"], e["pin"]) for e in pin_events(sim)[2:]]
    assert actions == [
        ("worker-gone", both.id),
        ("worker-gone", one.id),
        ("unpin", one.id),
        ("worker-gone", both.id),
        ("unpin", both.id),
    ]
    assert s.renew_pin(one.id, "r") is False and s.release_pin(one.id, "r") is False


def test_bad_input_is_refused_naming_the_problem():
    sim = sim3()
    s = sim.s
    with pytest.raises(ValueError, match="'tcp://nowhere:9': no such worker"):
        s.add_pin([W1, "tcp://nowhere:9"], "x", "client:c", None, "p")
    for lease in (0, 0.0, -1.0, math.nan, True, "5"):
        with pytest.raises(ValueError, match="lease is a positive number of seconds"):
            s.add_pin([W1], "x", "client:c", lease, "p")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one worker"):
        s.add_pin([], "x", "client:c", None, "p")
    for owner in ("c", ":c", "client:", ""):
        with pytest.raises(ValueError, match="owner is 'kind:id'"):
            s.add_pin([W1], "x", owner, None, "p")
    assert s.pins == {} and all(not ws.pins for ws in s.workers.values())
    assert pin_events(sim) == []  # nothing refused left a trace
    s.validate_state()


def test_a_retiring_worker_cannot_be_pinned():
    sim = Sim(workers={W1: 1, W2: 1})
    sim.submit({"x": []})
    holder = sim.worker_of("x")
    sim.finish("x")  # so that retiring its holder has something to copy, and waits
    sim.s.handle_client("c", RetireWorkers(1, [holder]))
    assert sim.ws(holder).status == "retiring"
    with pytest.raises(ValueError, match="the worker is retiring"):
        sim.s.add_pin([holder], "x", "client:c", None, "p")
    assert sim.s.pins == {}


# --- retirement ----------------------------------------------------------------------------


def test_retirement_refuses_pinned_workers_naming_reason_and_owner():
    sim = sim3()
    s = sim.s
    s.add_pin([W1], "live state", "client:d", None, "p1")
    s.add_pin([W1], "p2p", "shuffle:4", None, "p2")
    s.handle_client("c", RetireWorkers(1, [W1, W3]))
    [reply] = [msg for msg in sim.to_client() if isinstance(msg, RetireReply)]
    assert reply.retired == [W3]
    assert reply.refused == {
        W1: "pinned: live state (owner client:d); pinned: p2p (owner shuffle:4)"
    }
    assert W1 in s.workers and sim.ws(W1).status == "running" and W3 not in s.workers


def test_retirement_ignoring_pins_retires_and_releases_them():
    sim = sim3()
    s = sim.s
    alone = s.add_pin([W1], "alone", "client:d", None, "p1")
    shared = s.add_pin([W1, W2], "shared", "client:d", None, "p2")
    s.handle_client("c", RetireWorkers(1, ["w1:1"], ignore_pins=True))
    [reply] = [msg for msg in sim.to_client() if isinstance(msg, RetireReply)]
    assert reply.retired == [W1] and reply.refused == {}
    assert any(isinstance(msg, CloseWorker) for msg in sim.to_worker(W1))
    assert W1 not in s.workers
    assert set(s.pins) == {shared.id} and shared.workers == (W2,)
    assert alone.id not in s.pins
    whys = {e["why"] for e in pin_events(sim) if e["action"] == "worker-gone"}
    assert whys == {"retired ignoring pins"}


def test_a_refused_retirement_ignoring_pins_keeps_them():
    """ignore_pins lifts the pins only of the workers that actually retire."""
    sim = Sim(workers={W1: 1})
    pin = sim.s.add_pin([W1], "x", "client:c", None, "p")
    sim.s.handle_client("c", RetireWorkers(1, [W1], ignore_pins=True))
    [reply] = [msg for msg in sim.to_client() if isinstance(msg, RetireReply)]
    assert W1 in reply.refused and "no other running worker" in reply.refused[W1]
    assert sim.ws(W1).pins == {pin.id}


# --- client requests -------------------------------------------------------------------


def test_client_requests_pin_renew_and_release():
    sim = sim3()
    s = sim.s
    s.handle_client("c", PinWorkers(1, ["w1:1", W2], "cache", 30.0, "pin-1"))
    [reply] = replies(sim)
    assert reply.error == "" and reply.workers == [W1, W2] and reply.expires == 1030.0
    pin = s.pins[reply.pin_id]
    assert pin.owner == "client:c" and pin.reason == "cache"
    s.tick(1020.0)
    s.handle_client("c", RenewPin(2, pin.id, "renew-1"))
    [reply] = replies(sim)
    assert reply.done and reply.expires == 1050.0 == pin.expires
    s.handle_client("d", ReleasePin(3, pin.id, "not-mine"))  # another client's pin
    [reply] = replies(sim, "d")
    assert f"pin {pin.id} belongs to client:c" in reply.error and pin.id in s.pins
    s.handle_client("c", ReleasePin(4, pin.id, "unpin"))
    [reply] = replies(sim)
    assert reply.done and reply.error == "" and s.pins == {}
    s.handle_client("c", ReleasePin(5, pin.id, "unpin-again"))
    [reply] = replies(sim)
    assert reply.request_id == 5 and not reply.done and reply.error == ""
    s.handle_client("c", RenewPin(6, pin.id, "renew-gone"))
    [reply] = replies(sim)
    assert not reply.done and reply.error == ""


def test_client_requests_with_bad_input_are_answered_with_the_error():
    sim = sim3()
    s = sim.s
    s.handle_client("c", PinWorkers(1, ["nope"], "x"))
    s.handle_client("c", PinWorkers(2, [W1], "x", lease=-3.0))
    s.handle_client("c", PinWorkers(3, [], "x"))
    errors = [r.error for r in replies(sim)]
    assert errors == [
        "cannot pin 'nope': no such worker",
        "a pin's lease is a positive number of seconds, not -3.0",
        "a pin needs at least one worker",
    ]
    assert s.pins == {}


def test_worker_infos_show_pins():
    sim = sim3()
    s = sim.s
    a = s.add_pin([W1], "a", "client:c", 5.0, "p1")
    b = s.add_pin([W1, W2], "b", "shuffle:2", None, "p2")
    infos = {w.address: w for w in s.worker_infos()}
    assert [(p.id, p.reason, p.owner, p.expires) for p in infos[W1].pins] == [
        (a.id, "a", "client:c", 1005.0),
        (b.id, "b", "shuffle:2", None),
    ]
    assert [p.id for p in infos[W2].pins] == [b.id] and infos[W3].pins == []


def test_expiry_through_tick_is_validated():
    """A tick that expires a pin ends like any event: the invariants are checked."""
    sim = sim3()
    s = sim.s
    s.add_pin([W1], "x", "client:c", 1.0, "p")
    checked = []
    s.validate_state = lambda: checked.append(True)  # type: ignore[method-assign]
    s.tick(2000.0)
    assert s.pins == {} and checked
