"""Dask's lock parity on real processes: Semaphore/Lock lease timeouts (a holder that
stops refreshing loses its lease; one that refreshes keeps it past the timeout),
``Lock.locked``/``get_value``, and ``MultiLock(...).acquire(num_locks=)``."""

from __future__ import annotations

import time

import dask.config
import pytest

from shoal import Client, Lock, MultiLock, Semaphore

pytestmark = pytest.mark.timeout(120)
SHORT = {"distributed.scheduler.locks.lease-timeout": "1s"}  # Dask's key, honoured


def test_a_holder_that_stops_refreshing_loses_its_lease(client: Client) -> None:
    with dask.config.set(SHORT):
        stalled = Semaphore(max_leases=1, name="leases-stall", client=client)
        other = Semaphore(max_leases=1, name="leases-stall", client=client)
    assert stalled.lease_timeout == 1.0
    stalled.refresh_leases = False  # as a holder whose process hangs
    assert stalled.acquire()
    assert stalled.get_value() == 1
    start = time.monotonic()
    assert other.acquire(timeout=10)  # granted once the stalled lease expired
    assert 0.9 <= time.monotonic() - start < 8
    assert stalled.release() is False  # it had lost its lease
    assert other.get_value() == 1
    assert other.release() is True
    assert other.get_value() == 0


def test_a_refreshing_holder_keeps_its_lock_past_the_lease_timeout(client: Client) -> None:
    with dask.config.set(SHORT):
        held = Lock("leases-kept", client=client)
        other = Lock("leases-kept", client=client)
    assert held.acquire()
    assert held.locked() and held.get_value() == 1
    assert not other.acquire(timeout="2.5s")  # 2.5 lease timeouts: still held
    assert held.release() is True
    assert not other.locked() and other.get_value() == 0
    with pytest.raises(RuntimeError, match="not acquired"):
        held.release()  # Dask raises RuntimeError; shoal's ValueError catches it too


def test_leases_without_timeout_when_configured_inf(client: Client) -> None:
    with dask.config.set({"distributed.scheduler.locks.lease-timeout": "inf"}):
        forever = Lock("leases-inf", client=client)
    assert forever.lease_timeout is None
    forever.refresh_leases = False
    assert forever.acquire()
    assert not Lock("leases-inf", client=client).acquire(timeout=1.5)
    forever.release()


def test_multilock_num_locks_and_locked(client: Client) -> None:
    a = MultiLock(["ml-x"], client=client)
    assert a.acquire() and a.locked()
    any_two = MultiLock(["ml-x", "ml-y", "ml-z"], client=client)
    assert any_two.acquire(num_locks=2, timeout=5)  # y and z: x is held
    assert any_two.locked()
    any_one = MultiLock(["ml-y", "ml-x"], client=client)
    assert not any_one.acquire(num_locks=1, blocking=False)
    a.release()
    assert any_one.acquire(num_locks=1, timeout=5)  # x, given back by a
    assert not a.acquire(timeout=0.3)
    any_one.release()
    any_two.release()
    assert a.acquire(timeout=5)
    a.release()
    assert not a.locked()
    with pytest.raises(ValueError, match="num_locks is between 1 and 3"):
        MultiLock(["p", "q", "r"], client=client).acquire(num_locks=4)
