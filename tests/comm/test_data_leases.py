"""shoal/comm/same_host.py's lease table, without a network: a lease reads as held
only if its buffers were held from the moment they were lent, so an asker never
accepts a copy of memory that may have changed under it."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.comm.same_host import DataLeases
from shoal.protocol import messages as m


class FakeConn:
    """What DataLeases uses of a Connection: ``info``, ``on_close``, ``send``."""

    def __init__(self) -> None:
        self.info: dict[str, Any] = {}
        self.on_close: Any = None
        self.sent: list[m.Message] = []

    def send(self, msg: m.Message) -> None:
        self.sent.append(msg)

    def lost(self) -> None:
        if self.on_close is not None:
            self.on_close(self, None)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lent_buffers_stay_alive_until_given_back() -> None:
    leases = DataLeases()
    conn = FakeConn()
    arr = np.arange(1000.0)
    lent = leases.lend(conn, [memoryview(arr)])  # type: ignore[arg-type]
    assert lent is not None
    lease, where = lent
    assert where == [(arr.ctypes.data, arr.nbytes)]
    address = arr.ctypes.data
    del arr
    # The lease alone keeps the array (and so the address) alive.
    (held,) = leases._held[lease][1]
    assert np.frombuffer(held, dtype=np.float64).ctypes.data == address
    assert leases.made == 1 and leases.lent_bytes == 8000 and leases.nbytes == 8000
    assert leases.give_back(conn, lease)  # type: ignore[arg-type]
    assert len(leases) == 0 and leases.nbytes == 0


def test_answer_replies_only_when_asked_to() -> None:
    leases = DataLeases()
    conn = FakeConn()
    lent = leases.lend(conn, [memoryview(b"x" * 100)])  # type: ignore[arg-type]
    assert lent is not None
    leases.answer(conn, m.ReturnLease(7, lent[0]))  # type: ignore[arg-type]
    assert conn.sent == [m.LeaseReturned(7, True)]
    leases.answer(conn, m.ReturnLease(8, lent[0]))  # type: ignore[arg-type]
    assert conn.sent[-1] == m.LeaseReturned(8, False)  # not held twice
    lent = leases.lend(conn, [memoryview(b"y" * 100)])  # type: ignore[arg-type]
    assert lent is not None
    leases.answer(conn, m.ReturnLease(0, lent[0]))  # type: ignore[arg-type]
    assert len(conn.sent) == 2 and len(leases) == 0  # request 0: returned, no answer


def test_an_unaddressable_buffer_is_not_lent() -> None:
    leases = DataLeases()
    strided = memoryview(np.arange(10.0))[::2]
    assert leases.lend(FakeConn(), [memoryview(b"x" * 10), strided]) is None  # type: ignore[arg-type]
    assert len(leases) == 0 and leases.made == 0


def test_closing_a_connection_keeps_its_earlier_close_handler() -> None:
    leases = DataLeases()
    conn = FakeConn()
    seen = []
    conn.on_close = lambda c, exc: seen.append(c)
    leases.lend(conn, [memoryview(b"a" * 10)])  # type: ignore[arg-type]
    leases.lend(conn, [memoryview(b"b" * 10)])  # type: ignore[arg-type]
    conn.lost()
    assert seen == [conn] and len(leases) == 0


# ---------------------------------------------------------------- property

operations = st.lists(
    st.one_of(
        st.tuples(st.just("lend"), st.integers(0, 2)),
        st.tuples(st.just("give_back"), st.integers(0, 2), st.integers(0, 12)),
        st.tuples(st.just("close"), st.integers(0, 2)),
        st.tuples(st.just("wait"), st.sampled_from([0.0, 1.0, 4.0, 10.0])),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_a_lease_reads_held_only_if_held_all_along(ops: list[tuple[Any, ...]]) -> None:
    """Any interleaving of lends, returns (right or wrong connection, twice, unknown
    leases), closed connections and passing time: give_back says True exactly when
    the lease was lent to that connection, never returned, its connection never
    closed, and its time not up; whatever is not held is let go."""
    clock = Clock()
    leases = DataLeases(lease_seconds=5.0, clock=clock)
    conns = [FakeConn() for _ in range(3)]
    # the model: lease -> (connection index, expiry), while it must still be held
    live: dict[int, tuple[int, float]] = {}
    closed: set[int] = set()
    for op in ops:
        if op[0] == "lend":
            c = op[1]
            if c in closed:
                continue  # a closed connection asks nothing more
            lent = leases.lend(conns[c], [memoryview(b"z" * 64)])  # type: ignore[arg-type]
            assert lent is not None
            live[lent[0]] = (c, clock.now + 5.0)
        elif op[0] == "give_back":
            c, lease = op[1], op[2]
            expected = lease in live and live[lease][0] == c and clock.now < live[lease][1]
            assert leases.give_back(conns[c], lease) is expected  # type: ignore[arg-type]
            if expected:
                del live[lease]
        elif op[0] == "close":
            c = op[1]
            conns[c].lost()
            closed.add(c)
            live = {k: v for k, v in live.items() if v[0] != c}
        else:
            clock.now += op[1]
        live = {k: v for k, v in live.items() if clock.now < v[1]}
        # Nothing is held that the model says is let go (memory is not kept for nobody)
        # once the table has looked at the clock; held leases are a superset of live.
        assert set(live) <= set(leases._held)
    leases._expire()
    assert set(leases._held) == set(live)
