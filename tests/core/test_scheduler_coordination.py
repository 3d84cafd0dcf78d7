"""Coordination primitives in the pure core: requests in, replies and key holds out, no
network. Then the scheduler's side (futures stored in primitives stay alive), and a
property: no lease outlives its holder, and every request is answered exactly once."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_harness import Sim

from shoal.core.scheduler.coordination import CoordinationState, Outcome
from shoal.protocol.messages import Coordinate, CoordinateReply, RegisterActor

_rids = itertools.count(1)


def req(kind: str, name: str, op: str, **fields) -> Coordinate:
    return Coordinate(next(_rids), kind, name, op, **fields)


def answers(out: Outcome) -> dict[tuple[str, int], CoordinateReply]:
    return {(client, reply.request_id): reply for client, reply in out.replies}


def test_lock_grants_in_order_and_releases():
    c = CoordinationState()
    first = req("lock", "L", "acquire", token="t1", number=1)
    second = req("lock", "L", "acquire", token="t2", number=1)
    assert answers(c.handle("a", first, 0.0))[("a", first.request_id)].ok
    assert c.handle("b", second, 0.0).replies == []  # waits
    out = c.handle("a", req("lock", "L", "release", token="t1"), 1.0)
    replies = answers(out)
    assert replies[("b", second.request_id)].ok  # granted to the waiter
    assert c.leases_of("b") == [("lock", "L", "t2")] and c.leases_of("a") == []


def test_release_of_a_lease_not_held_is_refused():
    c = CoordinationState()
    c.handle("a", req("lock", "L", "acquire", token="t1", number=1), 0.0)
    ((_, reply),) = c.handle("b", req("lock", "L", "release", token="t1"), 0.0).replies
    assert reply.ok is False  # another client may not release a's lease
    assert c.leases_of("a") == [("lock", "L", "t1")]


def test_timeouts_zero_now_and_deadlines_later():
    c = CoordinationState()
    c.handle("a", req("semaphore", "S", "acquire", token="t1", number=1), 0.0)
    ((_, now),) = c.handle(
        "b", req("semaphore", "S", "acquire", token="t2", number=1, timeout=0), 0.0
    ).replies
    assert now.ok is False and now.timed_out
    late = req("semaphore", "S", "acquire", token="t3", number=1, timeout=2.0)
    assert not c.handle("b", late, 10.0)
    assert c.next_deadline() == 12.0
    assert not c.expire(11.9)
    ((_, reply),) = c.expire(12.0).replies
    assert reply.request_id == late.request_id and reply.timed_out and not reply.ok
    assert c.next_deadline() == float("inf")
    # the timed-out waiter is not granted later
    out = c.handle("a", req("semaphore", "S", "release", token="t1"), 13.0)
    assert [r.request_id for _, r in out.replies] == [out.replies[0][1].request_id]
    assert c.leases_of("b") == []


def test_semaphore_max_leases_must_agree():
    c = CoordinationState()
    c.handle("a", req("semaphore", "S", "acquire", token="t1", number=2), 0.0)
    ((_, reply),) = c.handle(
        "a", req("semaphore", "S", "acquire", token="t2", number=3), 0.0
    ).replies
    assert "max_leases=2" in reply.error


def test_bad_requests_name_the_problem():
    c = CoordinationState()
    cases = [
        (req("barrier", "x", "wait"), "unknown coordination primitive 'barrier'"),
        (req("queue", "x", "pop"), "a queue has no operation 'pop'"),
        (req("queue", "", "get"), "name is a non-empty str"),
        (req("event", "x", "wait", timeout=-1.0), "timeout is a number of seconds"),
        (req("lock", "x", "acquire", number=1), "needs a token"),
        (req("semaphore", "x", "acquire", token="t", number=0), "max_leases is >= 1"),
        (req("pubsub", "x", "get", token="nope"), "no subscription 'nope'"),
    ]
    for msg, error in cases:
        ((_, reply),) = c.handle("a", msg, 0.0).replies
        assert error in reply.error and not reply.ok, (msg, reply)


def test_client_leaving_releases_leases_and_grants_waiters():
    c = CoordinationState()
    c.handle("a", req("semaphore", "S", "acquire", token="t1", number=2), 0.0)
    c.handle("a", req("semaphore", "S", "acquire", token="t2", number=2), 0.0)
    waiting_b = req("semaphore", "S", "acquire", token="t3", number=2)
    waiting_a = req("semaphore", "S", "acquire", token="t4", number=2)
    c.handle("b", waiting_b, 0.0)
    c.handle("a", waiting_a, 0.0)
    out = c.remove_client("a")
    assert list(answers(out)) == [("b", waiting_b.request_id)]  # a's own waiter is dropped
    assert c.leases_of("a") == [] and c.leases_of("b") == [("semaphore", "S", "t3")]


def test_event_wakes_every_waiter():
    c = CoordinationState()
    w1, w2 = req("event", "E", "wait"), req("event", "E", "wait", timeout=5.0)
    c.handle("a", w1, 0.0)
    c.handle("b", w2, 0.0)
    out = answers(c.handle("c", req("event", "E", "set"), 1.0))
    assert out[("a", w1.request_id)].ok and out[("b", w2.request_id)].ok
    assert not c.expire(100.0)  # answered: the deadline no longer applies
    assert answers(c.handle("a", (r := req("event", "E", "is_set")), 1.0))[("a", r.request_id)].ok


def test_variable_holds_its_key_until_replaced():
    c = CoordinationState()
    out = c.handle("a", req("variable", "V", "set", key="k1"), 0.0)
    assert out.hold == ["k1"] and out.drop == []
    get = req("variable", "V", "get")
    out = c.handle("b", get, 0.0)
    assert out.give == [("b", "k1")] and out.replies[0][1].key == "k1"
    out = c.handle("a", req("variable", "V", "set", value=b"v"), 0.0)
    assert out.drop == ["k1"] and c.key_refs == {}
    out = c.handle("a", req("variable", "V", "delete"), 0.0)
    assert "V" not in c.variables


def test_queue_fifo_batches_and_key_counts():
    c = CoordinationState()
    c.handle("a", req("queue", "Q", "create", number=2), 0.0)
    c.handle("a", req("queue", "Q", "put", key="k"), 0.0)
    out = c.handle("a", req("queue", "Q", "put", key="k"), 0.0)
    assert out.hold == [] and c.key_refs == {"k": 2}  # held once, counted twice
    blocked = req("queue", "Q", "put", value=b"3")
    assert not c.handle("a", blocked, 0.0)  # full: the put waits
    get = req("queue", "Q", "get")
    out = c.handle("b", get, 0.0)
    replies = answers(out)
    assert replies[("b", get.request_id)].key == "k" and replies[("a", blocked.request_id)].ok
    assert out.give == [("b", "k")] and out.drop == []  # one copy still queued
    batch = req("queue", "Q", "get", number=3)
    assert not c.handle("b", batch, 0.0)  # two items there; waits for a third
    out = c.handle("a", req("queue", "Q", "put", value=b"4"), 0.0)
    reply = answers(out)[("b", batch.request_id)]
    assert reply.items == [(None, "k"), (b"3", None), (b"4", None)]
    assert out.drop == ["k"] and c.key_refs == {}
    out = c.handle("b", (everything := req("queue", "Q", "get", number=-1)), 0.0)
    assert answers(out)[("b", everything.request_id)].items == []


def test_a_batch_get_that_times_out_gives_its_items_back():
    c = CoordinationState()
    c.handle("a", req("queue", "Q", "create", number=1), 0.0)
    c.handle("a", req("queue", "Q", "put", value=b"1"), 0.0)
    blocked = req("queue", "Q", "put", value=b"2")
    c.handle("a", blocked, 0.0)  # the queue is full
    batch = req("queue", "Q", "get", number=3, timeout=1.0)
    out = c.handle("b", batch, 0.0)  # takes both as they come, waits for a third
    assert list(answers(out)) == [("a", blocked.request_id)]
    assert list(c.queues["Q"].items) == []
    ((_, reply),) = c.expire(1.0).replies
    assert reply.request_id == batch.request_id and reply.timed_out
    assert list(c.queues["Q"].items) == [(b"1", None), (b"2", None)]  # back, in order


def test_pubsub_reaches_current_subscribers_only():
    c = CoordinationState()
    c.handle("a", req("pubsub", "T", "subscribe", token="s1"), 0.0)
    out = c.handle("p", req("pubsub", "T", "publish", value=b"m1"), 0.0)
    assert out.replies[0][1].number == 1
    c.handle("b", req("pubsub", "T", "subscribe", token="s2"), 0.0)
    get1 = req("pubsub", "T", "get", token="s1", timeout=0)
    assert answers(c.handle("a", get1, 0.0))[("a", get1.request_id)].value == b"m1"
    get2 = req("pubsub", "T", "get", token="s2")
    assert not c.handle("b", get2, 0.0)  # nothing for the late subscriber yet
    out = c.handle("p", req("pubsub", "T", "publish", key="k"), 0.0)
    assert answers(out)[("b", get2.request_id)].key == "k"
    assert c.key_refs == {"k": 1}  # still queued for s1
    c.remove_client("a")
    assert c.key_refs == {} and list(c.subscriptions) == ["s2"]


# ---------------------------------------------------------------------- the scheduler's side


def coordinate(sim: Sim, client: str, msg: Coordinate) -> list[CoordinateReply]:
    sim.s.handle_client(client, msg)
    return [r for r in sim.to_client(client) if isinstance(r, CoordinateReply)]


def test_a_future_in_a_variable_outlives_its_client_releasing_it():
    sim = Sim(clients=("c", "d"))
    sim.submit({"x": []})
    sim.run_all()
    coordinate(sim, "c", req("variable", "V", "set", key="x"))
    sim.release("x")
    assert sim.ts("x").state == "memory"  # the variable keeps it
    (reply,) = coordinate(sim, "d", req("variable", "V", "get"))
    assert reply.key == "x" and sim.s.clients["d"] in sim.ts("x").who_wants
    coordinate(sim, "c", req("variable", "V", "delete"))
    assert sim.ts("x").state == "memory"  # d wants it now
    sim.release("x", client="d")
    assert "x" not in sim.s.tasks


def test_a_future_moves_from_a_queue_to_its_getter():
    sim = Sim(clients=("c", "d"))
    sim.submit({"y": []})
    sim.run_all()
    coordinate(sim, "c", req("queue", "Q", "put", key="y"))
    sim.s.remove_client("c", "c-left")
    assert sim.ts("y").state == "memory"
    (reply,) = coordinate(sim, "d", req("queue", "Q", "get"))
    assert reply.key == "y"
    assert set(sim.ts("y").who_wants) == {sim.s.clients["d"]}  # the queue let go of it
    sim.release("y", client="d")
    assert "y" not in sim.s.tasks


def test_an_unknown_future_is_refused():
    sim = Sim()
    (reply,) = coordinate(sim, "c", req("queue", "Q", "put", key="nowhere"))
    assert "does not know it" in reply.error


# ---------------------------------------------------------------------- property


ops = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "acquire_wait", "release", "leave", "tick"]),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["S1", "S2"]),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_no_lease_outlives_its_holder_and_every_request_is_answered_once(steps):
    c = CoordinationState()
    now = 0.0
    present = {"a", "b", "c"}
    pending: dict[int, str] = {}  # request id -> client, not yet answered
    answered: set[int] = set()
    tokens = itertools.count()

    def apply(out: Outcome) -> None:
        for client, reply in out.replies:
            assert reply.request_id not in answered, "answered twice"
            answered.add(reply.request_id)
            assert pending.pop(reply.request_id) == client

    for op, client, name in steps:
        if op == "tick":
            now += 1.0
            apply(c.expire(now))
        elif op == "leave":
            apply(c.remove_client(client))
            pending = {r: x for r, x in pending.items() if x != client}  # never answered
            present.discard(client)
        elif client in present and op in ("acquire", "acquire_wait"):
            timeout = 0.0 if op == "acquire" else 1.5
            msg = req(
                "semaphore", name, "acquire", token=f"t{next(tokens)}", number=2, timeout=timeout
            )
            pending[msg.request_id] = client
            apply(c.handle(client, msg, now))
        elif client in present and op == "release" and c.leases_of(client):
            _, lname, token = c.leases_of(client)[0]
            msg = req("semaphore", lname, "release", token=token)
            pending[msg.request_id] = client
            apply(c.handle(client, msg, now))
        for sem in c.semaphores.values():
            assert len(sem.leases) <= sem.max_leases
            assert set(sem.leases.values()) <= present, "a lease outlived its holder"
    now += 10.0
    apply(c.expire(now))
    assert not pending, "a request was never answered"


# ---------------------------------------------------------------------- actors' pins


def test_an_actors_worker_is_pinned_while_its_key_is_in_memory():
    sim = Sim(workers={"tcp://w1:1": 1, "tcp://w2:1": 1})
    sim.submit({"actor-1": []})
    sim.s.handle_client("c", RegisterActor(["actor-1"], "register"))
    assert sim.s.pins == {}  # not in memory yet: nothing to pin
    holder = sim.worker_of("actor-1")
    sim.run_all()
    (pin,) = sim.s.pins.values()
    assert pin.workers == (holder,) and pin.owner == "actor:'actor-1'"
    assert sim.s.is_pinned(holder)
    sim.release("actor-1")
    assert "actor-1" not in sim.s.tasks and sim.s.pins == {}
    assert sim.s.actor_keys == {}


def test_an_actor_registered_after_it_finished_is_pinned_at_once():
    sim = Sim()
    sim.submit({"a": []})
    sim.run_all()
    sim.s.handle_client("c", RegisterActor(["a", "unknown"], "register"))
    (pin,) = sim.s.pins.values()
    assert pin.owner == "actor:'a'"


def test_an_actors_pin_goes_with_its_worker_and_comes_back_with_the_rerun():
    sim = Sim(workers={"tcp://w1:1": 1, "tcp://w2:1": 1})
    sim.submit({"a": []})
    sim.s.handle_client("c", RegisterActor(["a"], "register"))
    first = sim.worker_of("a")
    sim.run_all()
    sim.remove_worker(first)
    assert sim.s.pins == {}  # the worker died: its pin went with it
    second = sim.worker_of("a")  # the actor's task runs again elsewhere
    assert second != first
    sim.run_all()
    (pin,) = sim.s.pins.values()
    assert pin.workers == (second,)


scheduler_steps = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "release", "put", "get", "set", "leave", "join", "tick"]),
        st.sampled_from(["c", "d", "e"]),
        st.integers(0, 3),
    ),
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(scheduler_steps)
def test_in_the_scheduler_no_lease_or_held_future_breaks_an_invariant(steps):
    """Clients come and go while taking leases and passing futures through a queue and
    a variable; the scheduler's validation (on after every event) checks that no lease
    outlives its client and that every key a primitive holds is alive and wanted."""
    sim = Sim(clients=("c", "d", "e"))
    keys = [f"k{i}" for i in range(4)]
    sim.submit({k: [] for k in keys})
    sim.run_all()
    now = 0.0
    for op, client, i in steps:
        if op == "tick":
            now += 1.0
            sim.s.tick(now)
            continue
        if op == "join":
            sim.s.add_client(client)
            continue
        if client not in sim.s.clients:
            continue
        if op == "leave":
            sim.s.remove_client(client, f"leave-{client}")
        elif op == "acquire":
            msg = req("semaphore", "S", "acquire", token=f"{client}-{i}", number=2, timeout=1.5)
            sim.s.handle_client(client, msg)
        elif op == "release":
            sim.s.handle_client(client, req("semaphore", "S", "release", token=f"{client}-{i}"))
        elif op in ("put", "set") and keys[i] in sim.s.tasks:
            kind = "queue" if op == "put" else "variable"
            sim.s.handle_client(client, req(kind, "Q", op, key=keys[i]))
        elif op == "get":
            sim.s.handle_client(client, req("queue", "Q", "get", timeout=0.5))
        sim.s.validate_state()
    for client in list(sim.s.clients):
        sim.s.remove_client(client, "end")
    sim.s.validate_state()
    held = set(sim.s.coordination.key_refs)
    assert set(sim.s.tasks) == held  # only what the primitives still hold is kept


# --- lease timeouts (Dask's distributed.scheduler.locks.lease-timeout) -------------------


def test_a_lease_not_refreshed_within_its_timeout_is_released_to_the_next_waiter():
    c = CoordinationState()
    held = req("semaphore", "S", "acquire", token="t1", number=1, lease_timeout=10.0)
    assert answers(c.handle("a", held, 0.0))[("a", held.request_id)].ok
    waiting = req("semaphore", "S", "acquire", token="t2", number=1)
    assert not c.handle("b", waiting, 1.0)
    assert c.next_deadline() == 10.0
    # refreshed at 8: alive until 18
    ((_, ok),) = c.handle("a", req("semaphore", "S", "refresh", token="t1"), 8.0).replies
    assert ok.ok
    assert not c.expire(10.0) and c.leases_of("a") == [("semaphore", "S", "t1")]
    assert c.next_deadline() == 18.0
    out = c.expire(18.0)  # a stalled: no refresh since 8
    assert answers(out)[("b", waiting.request_id)].ok
    assert c.leases_of("a") == [] and c.leases_of("b") == [("semaphore", "S", "t2")]
    assert c.expired_leases == 1
    # the stalled holder finds out: its refresh and its release are refused
    ((_, late),) = c.handle("a", req("semaphore", "S", "refresh", token="t1"), 19.0).replies
    assert late.ok is False
    ((_, rel),) = c.handle("a", req("semaphore", "S", "release", token="t1"), 19.0).replies
    assert rel.ok is False and c.leases_of("b") == [("semaphore", "S", "t2")]
    # the lease granted to b at 18 has the semaphore's timeout too
    assert c.next_deadline() == 28.0


def test_leases_without_a_timeout_never_expire_and_released_ones_leave_no_check():
    c = CoordinationState()
    c.handle("a", req("lock", "L", "acquire", token="t1", number=1), 0.0)
    assert c.next_deadline() == float("inf") and not c.expire(1e9)
    c.handle("a", req("lock", "M", "acquire", token="t2", number=1, lease_timeout=5.0), 0.0)
    c.handle("a", req("lock", "M", "release", token="t2"), 1.0)
    assert not c.expire(6.0) and c.expired_leases == 0
    ((_, bad),) = c.handle(
        "a", req("lock", "N", "acquire", token="t3", number=1, lease_timeout=0.0), 0.0
    ).replies
    assert "lease timeout" in bad.error


# --- MultiLock (Dask's MultiLockExtension) -------------------------------------------------


def multi(names, token, number=None, **fields) -> Coordinate:
    return req(
        "multilock",
        "multilock",
        "acquire",
        names=names,
        token=token,
        number=len(names) if number is None else number,
        **fields,
    )


def test_multilock_all_names_or_wait_and_granted_when_the_last_is_released():
    c = CoordinationState()
    ab = multi(["a", "b"], "r1")
    assert answers(c.handle("x", ab, 0.0))[("x", ab.request_id)].ok
    bc = multi(["b", "c"], "r2")
    assert not c.handle("y", bc, 0.0)  # holds c, waits for b
    c_only = multi(["c"], "r3", timeout=0)
    ((_, refused),) = c.handle("z", c_only, 0.0).replies
    assert refused.timed_out and not refused.ok  # c is held by the waiting request
    out = c.handle("x", req("multilock", "multilock", "release", token="r1"), 1.0)
    assert answers(out)[("y", bc.request_id)].ok
    assert {name: [r.token for r in q] for name, q in c.multilocks.items()} == {
        "b": ["r2"],
        "c": ["r2"],
    }


def test_multilock_num_locks_takes_any_that_many_and_leaves_the_other_queues():
    c = CoordinationState()
    c.handle("x", multi(["a"], "r1"), 0.0)
    two_of_three = multi(["a", "b", "c"], "r2", number=2)
    assert answers(c.handle("y", two_of_three, 0.0))[("y", two_of_three.request_id)].ok
    assert [r.token for r in c.multilocks["a"]] == ["r1"]  # never queued on a
    one_of_two = multi(["b", "a"], "r3", number=1)
    assert not c.handle("z", one_of_two, 0.0)  # a and b both held
    out = c.handle("x", req("multilock", "multilock", "release", token="r1"), 1.0)
    assert answers(out)[("z", one_of_two.request_id)].ok  # got a; b's queue left
    assert [r.token for r in c.multilocks["b"]] == ["r2"]
    assert c.multi_requests["r3"].names == ["a"]


def test_multilock_timeout_and_a_leaving_client_give_their_places_back():
    c = CoordinationState()
    c.handle("x", multi(["a"], "r1"), 0.0)
    slow = multi(["a", "b"], "r2", timeout=2.0)
    assert not c.handle("y", slow, 0.0)  # holds b, waits for a
    after = multi(["b"], "r3")
    assert not c.handle("z", after, 0.0)
    out = c.expire(2.0)
    replies = answers(out)
    assert replies[("y", slow.request_id)].timed_out
    assert replies[("z", after.request_id)].ok  # b passed on when r2 gave up
    out = c.remove_client("x", 3.0)
    assert c.multilocks == {"b": c.multilocks["b"]} and "r1" not in c.multi_requests


def test_multilock_bad_requests_are_refused_with_the_reason():
    c = CoordinationState()
    for names, number, why in (
        ([], 0, "non-empty lock names"),
        (["a", "a"], 2, "distinct"),
        (["a", "b"], 3, "num_locks is between 1 and 2"),
    ):
        ((_, reply),) = c.handle("x", multi(names, "r", number=number), 0.0).replies
        assert why in reply.error and not reply.ok
    ((_, reply),) = c.handle(
        "x", req("multilock", "multilock", "release", token="nope"), 0.0
    ).replies
    assert reply.ok is False


multilock_ops = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "acquire", "release", "leave", "tick", "lease", "refresh"]),
        st.sampled_from(["a", "b", "c"]),
        st.lists(st.sampled_from(["x", "y", "z", "w"]), min_size=1, max_size=4, unique=True),
        st.integers(0, 3),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(multilock_ops)
def test_multilocks_and_lease_timeouts_never_double_grant_and_answer_everything_once(steps):
    """MultiLock requests (any names, any num_locks, timeouts) and semaphore leases
    that expire unless refreshed, with clients leaving: no lock name is held by two
    requests, a granted request holds exactly num_locks names, no lease outlives its
    timeout without a refresh, every request is answered exactly once."""
    c = CoordinationState()
    now = 0.0
    present = {"a", "b", "c"}
    pending: dict[int, str] = {}
    answered: set[int] = set()
    tokens = itertools.count()
    wanted: dict[str, int] = {}  # request token -> num_locks
    refreshed: dict[str, float] = {}  # lease token -> last grant or refresh

    def apply(out: Outcome) -> None:
        for client, reply in out.replies:
            assert reply.request_id not in answered, "answered twice"
            answered.add(reply.request_id)
            assert pending.pop(reply.request_id) == client

    for op, client, names, n in steps:
        if op == "tick":
            now += 1.0
            apply(c.expire(now))
        elif op == "leave" and client in present:
            apply(c.remove_client(client, now))
            pending = {r: x for r, x in pending.items() if x != client}
            present.discard(client)
        elif client not in present:
            continue
        elif op == "acquire":
            token = f"m{next(tokens)}"
            number = 1 + n % len(names)
            wanted[token] = number
            msg = req(
                "multilock",
                "multilock",
                "acquire",
                names=names,
                token=token,
                number=number,
                timeout=[0.0, 1.5, 3.0][n % 3],
            )
            pending[msg.request_id] = client
            apply(c.handle(client, msg, now))
        elif op == "release":
            mine = [r for r in c.multi_requests.values() if r.client == client and r.granted]
            if mine:
                msg = req("multilock", "multilock", "release", token=mine[0].token)
                pending[msg.request_id] = client
                apply(c.handle(client, msg, now))
        elif op == "lease":
            token = f"l{next(tokens)}"
            msg = req(
                "semaphore", "S", "acquire", token=token, number=1, timeout=0.0, lease_timeout=2.0
            )
            pending[msg.request_id] = client
            apply(c.handle(client, msg, now))
        elif op == "refresh":
            for _, _, token in c.leases_of(client):
                msg = req("semaphore", "S", "refresh", token=token)
                pending[msg.request_id] = client
                apply(c.handle(client, msg, now))
        for sem in c.semaphores.values():  # leases granted or refreshed are known here
            for token in sem.leases:
                refreshed[token] = sem.refreshed[token]
                assert now - sem.refreshed[token] <= 2.0, "a lease outlived its timeout"
        held: dict[str, str] = {}
        for name, queue in c.multilocks.items():
            assert queue, "an empty queue is kept"
            assert all(r.token in c.multi_requests for r in queue)
            if queue[0].granted:
                assert name not in held
                held[name] = queue[0].token
        for request in c.multi_requests.values():
            assert request.client in present, "a request outlived its client"
            for name in request.names:
                assert request in c.multilocks[name]
            if request.granted:
                assert len(request.names) == wanted[request.token]
                assert all(c.multilocks[name][0] is request for name in request.names)
    now += 10.0
    apply(c.expire(now))
    assert not pending, "a request was never answered"
