"""``client.rebalance`` in the scheduler core: which moves, copy-then-drop, and what
gives a move up. No network: the Sim feeds events and reads the messages sent."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import W1, W2, W3, Sim, addr

from shoal.core.scheduler.rebalance import MOVE_TIMEOUT, find_moves
from shoal.protocol.messages import CopyKeys, FreeKeys, Heartbeat, RebalanceReply, RebalanceRequest

LIMIT = 1000  # memory limit of the workers: 30% (sender_min) is 300 bytes


def cluster(n: int = 3) -> Sim:
    sim = Sim({})
    for i in range(1, n + 1):
        sim.add_worker(addr(i), memory_limit=LIMIT)
    return sim


def rebalance(sim: Sim, keys=None, workers=(), request_id=1, client="c") -> None:
    sim.s.handle_client(
        client, RebalanceRequest(request_id, keys, list(workers), f"rebalance-{request_id}")
    )


def copies_asked(sim: Sim, address: str) -> dict:
    """{key: [holders to fetch from]} of the CopyKeys sent to ``address``."""
    out = {}
    for msg in sim.to_worker(address):
        if isinstance(msg, CopyKeys):
            out.update({d.key: d.who_has for d in msg.deps})
    return out


def replies(sim: Sim, client: str = "c") -> list[RebalanceReply]:
    return [msg for msg in sim.to_client(client) if isinstance(msg, RebalanceReply)]


def holders(sim: Sim, key) -> set[str]:
    return {ws.address for ws in sim.ts(key).who_has}


def test_keys_move_from_the_full_worker_to_the_empty_ones_copy_then_drop():
    sim = cluster(3)
    sim.scatter(W1, {f"x{i}": 100 for i in range(6)})  # 600 on W1, mean 200
    sim.clear()
    rebalance(sim)
    to_w2, to_w3 = copies_asked(sim, W2), copies_asked(sim, W3)
    assert len(to_w2) == 2 and len(to_w3) == 2  # each recipient up to the mean
    assert all(v == [W1] for v in {**to_w2, **to_w3}.values())
    assert sim.freed(W1) == [] and replies(sim) == []  # nothing dropped before a copy
    sim.add_keys(W2, dict.fromkeys(to_w2, 100))
    assert sorted(sim.freed(W1)) == sorted(to_w2)
    for key in to_w2:
        assert holders(sim, key) == {W2}
    assert replies(sim) == []  # W3's moves are still on their way
    sim.add_keys(W3, dict.fromkeys(to_w3, 100))
    assert sorted(sim.freed(W1)) == sorted(to_w3)
    assert [(r.request_id, r.moved, r.abandoned) for r in replies(sim)] == [(1, 4, 0)]
    assert [sim.ws(a).nbytes for a in (W1, W2, W3)] == [200, 200, 200]
    assert sim.s.moves == {}


def test_nothing_moves_below_the_sender_minimum_or_within_the_gap():
    sim = cluster(2)
    sim.scatter(W1, {"a": 100, "b": 100})  # 200 < 30% of 1000
    sim.clear()
    rebalance(sim)
    assert copies_asked(sim, W2) == {}
    assert [(r.moved, r.abandoned) for r in replies(sim)] == [(0, 0)]
    sim.scatter(W2, {"c": 100, "d": 100, "e": 30})  # 230 vs 200: within the 10% gap
    sim.scatter(W1, {"f": 200})  # 400 vs 230: the gap is 100
    sim.clear()
    rebalance(sim, request_id=2)
    # mean 315: moving any 100- or 200-byte key would take W1 below the mean... a
    # 200-byte one would (400-200 < 315); a 100-byte one brings it to 300 < 315 too.
    assert copies_asked(sim, W2) == {}
    assert [(r.request_id, r.moved) for r in replies(sim)] == [(2, 0)]


def test_keys_and_workers_restrict_what_moves_where():
    sim = cluster(3)
    sim.scatter(W1, {f"x{i}": 100 for i in range(6)})
    sim.clear()
    rebalance(sim, keys=["x0", "x1", "nope"], workers=["w1:1", W3])  # names or addresses
    assert copies_asked(sim, W2) == {}
    # among W1 and W3 the mean is 300: W3 may take 3, only 2 are allowed
    assert sorted(copies_asked(sim, W3)) == ["x0", "x1"]


def test_a_recipient_that_dies_leaves_the_key_on_its_sender():
    sim = cluster(2)
    sim.scatter(W1, {"a": 300, "b": 300})
    sim.clear()
    rebalance(sim)
    (key,) = copies_asked(sim, W2)
    sim.remove_worker(W2)
    assert holders(sim, key) == {W1} and sim.freed(W1) == []
    assert [(r.moved, r.abandoned) for r in replies(sim)] == [(0, 1)]


def test_a_sender_that_dies_mid_move_is_no_drop_and_the_key_is_recomputed_if_lost():
    sim = cluster(2)
    sim.submit({"a": []})
    sim.finish("a", nbytes=800, worker=W1)
    sim.clear()
    rebalance(sim)
    assert copies_asked(sim, W2) == {}  # one key: moving it would overshoot the mean
    sim.scatter(W1, {"b": 100, "c": 100})
    sim.clear()
    rebalance(sim, request_id=2)
    assert sorted(copies_asked(sim, W2)) == ["b", "c"]  # W1 stays above the mean
    sim.remove_worker(W1)
    assert [(r.request_id, r.moved, r.abandoned) for r in replies(sim)] == [(2, 0, 2)]
    assert sim.s.moves == {}
    assert sim.state("a") == "processing" and sim.worker_of("a") == W2  # recomputed


def test_a_copy_that_never_comes_is_given_up_and_a_late_one_is_only_a_replica():
    sim = cluster(2)
    sim.scatter(W1, {"a": 300, "b": 300})
    sim.s.heartbeat(W1, Heartbeat(0), now=100.0)
    sim.clear()
    rebalance(sim)
    (key,) = copies_asked(sim, W2)
    sim.s.heartbeat(W1, Heartbeat(0), now=100.0 + MOVE_TIMEOUT / 2)
    assert replies(sim) == []  # still waiting
    sim.s.heartbeat(W1, Heartbeat(0), now=101.0 + MOVE_TIMEOUT)
    assert [(r.moved, r.abandoned) for r in replies(sim)] == [(0, 1)]
    sim.add_keys(W2, {key: 300})  # the copy arrives after all: kept as a second replica
    assert holders(sim, key) == {W1, W2} and sim.freed(W1) == []


def test_a_key_released_during_its_move_is_dropped_by_the_recipient_too():
    sim = cluster(2)
    sim.scatter(W1, {"a": 300, "b": 300})
    sim.clear()
    rebalance(sim)
    (key,) = copies_asked(sim, W2)
    sim.release(key)
    assert sim.state(key) == "forgotten"
    assert [(r.moved, r.abandoned) for r in replies(sim)] == [(0, 1)]
    sim.add_keys(W2, {key: 300})
    assert sim.freed(W2) == [key]


def test_a_recipient_that_starts_retiring_gets_no_move():
    sim = cluster(3)
    sim.scatter(W1, {f"x{i}": 100 for i in range(6)})
    sim.clear()
    rebalance(sim)
    to_w2 = copies_asked(sim, W2)
    sim.s.retire_for_scaling([sim.ws(W2)], "scale-down")
    sim.add_keys(W2, dict.fromkeys(to_w2, 100))  # arrives, but W2 is leaving
    assert sim.freed(W1) == []
    assert all(W1 in holders(sim, k) for k in to_w2)


def test_a_second_rebalance_does_not_move_keys_already_moving():
    sim = cluster(3)
    sim.scatter(W1, {f"x{i}": 100 for i in range(6)})
    sim.clear()
    rebalance(sim, request_id=1)
    first = {**copies_asked(sim, W2), **copies_asked(sim, W3)}
    rebalance(sim, request_id=2)
    second = {**copies_asked(sim, W2), **copies_asked(sim, W3)}
    assert not set(first) & set(second)


def test_find_moves_never_takes_a_sender_below_the_mean():
    sim = cluster(2)
    sim.scatter(W1, {"big": 500, "small": 100})
    moves = find_moves(None, [sim.ws(W1), sim.ws(W2)])
    # mean 300: "big" would leave W1 at 100 < 300; "small" leaves it at 500
    assert [(s.address, r.address, ts.key) for s, r, ts in moves] == [(W1, W2, "small")]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=12),
    steps=st.lists(
        st.tuples(st.sampled_from(["rebalance", "confirm", "fail", "lose", "add"]), st.integers()),
        max_size=40,
    ),
)
def test_no_sequence_of_rebalances_lost_workers_and_failed_copies_loses_a_last_copy(sizes, steps):
    """Keys (scattered: no way to recompute them) must stay in memory, somewhere a
    worker really holds them, unless every worker that held one died; ``truth`` is
    what each worker really holds, fed by the messages the scheduler sends."""
    sim = cluster(3)
    n_workers = 3
    truth: dict[str, set] = {addr(i): set() for i in range(1, 4)}
    for i, size in enumerate(sizes):
        worker = addr(1 + i % 2)  # W3 starts empty
        sim.scatter(worker, {f"k{i}": size})
        truth[worker].add(f"k{i}")
    asked: dict[str, dict] = {}  # worker -> {key: (nbytes, holders)} copies asked of it
    lost: set[str] = set()  # keys every holder of which died
    request = 0

    def read_messages():
        for address in list(truth):
            for msg in sim.to_worker(address):
                if isinstance(msg, CopyKeys):
                    for d in msg.deps:
                        asked.setdefault(address, {})[d.key] = (d.nbytes, d.who_has)
                elif isinstance(msg, FreeKeys):
                    truth[address].difference_update(msg.keys)

    for action, pick in steps:
        gone_keys: set[str] = set()
        if action == "rebalance":
            request += 1
            rebalance(sim, request_id=request)
        elif action in ("confirm", "fail"):
            candidates = sorted(a for a in truth if asked.get(a))
            if candidates:
                address = candidates[pick % len(candidates)]
                key = sorted(asked[address])[pick % len(asked[address])]
                nbytes, sources = asked[address].pop(key)
                fetched = any(key in truth.get(source, ()) for source in sources)
                if action == "confirm" and fetched:
                    truth[address].add(key)
                    sim.add_keys(address, {key: nbytes})
                else:  # the worker gives up silently; time passes
                    sim.s.heartbeat(address, Heartbeat(0), now=sim.s._now + MOVE_TIMEOUT + 1)
        elif action == "lose" and len(truth) > 1:
            address = sorted(truth)[pick % len(truth)]
            sim.remove_worker(address)
            gone_keys = truth.pop(address)
            asked.pop(address, None)
        elif action == "add":
            n_workers += 1
            address = addr(n_workers)
            sim.add_worker(address, memory_limit=LIMIT)
            truth[address] = set()
        read_messages()
        for i in range(len(sizes)):
            key = f"k{i}"
            if key in lost:
                continue
            really = {a for a, held in truth.items() if key in held}
            if sim.state(key) == "memory":
                assert holders(sim, key) <= really, (key, holders(sim, key), really)
                assert holders(sim, key), key
            else:  # only the death of its last holder may lose a key
                assert key in gone_keys and not really, (key, sim.state(key), really)
                lost.add(key)
    assert sim.s.moves.keys() <= {sim.ts(k) for k in sim.s.tasks}


def test_has_what_pages_list_every_clients_keys_of_one_worker():
    sim = Sim({}, clients=("c", "d"))
    sim.add_worker(W1, memory_limit=LIMIT)
    sim.add_worker(W2, memory_limit=LIMIT)
    sim.scatter(W1, {f"c{i}": 1 for i in range(5)}, client="c")
    sim.scatter(W1, {f"d{i}": 1 for i in range(4)}, client="d")
    pages, start = [], 0
    while True:
        page = sim.s.has_what_page("w1:1", start, 4)  # by name
        assert page.address == W1 and page.total == 9
        pages.append(page.keys)
        start += len(page.keys)
        if len(page.keys) < 4:
            break
    assert [len(p) for p in pages] == [4, 4, 1]
    assert sorted(k for p in pages for k in p) == sorted(sim.holds(W1))
    assert sim.s.has_what_page(W2, 0, 10).keys == []
    assert sim.s.has_what_page("nope", 0, 10).address == ""
    assert sim.s.has_what_page(W1, 100, 10).keys == []  # past the end: empty
