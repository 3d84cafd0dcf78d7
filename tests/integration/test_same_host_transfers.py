"""Same-host transfers on real processes (shoal/comm/same_host.py): large buffers
between workers, and from a worker to a client, on one machine are lent by the
holder and copied from its memory; the values arrive exact, every lease is given
back, and whenever the copy cannot be trusted or made the data comes by socket."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import dask.config
import numpy as np
import pandas as pd
import pytest

from shoal import Client, LocalCluster, wait
from shoal.comm import cross_memory, same_host

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(cross_memory.host_identity() is None, reason="Linux only"),
]

N = 2_000_000  # 16 MB of float64: above LEND_MIN, and off the event loop


def make_array(seed: int) -> Any:
    return np.arange(N, dtype=np.float64) * seed


def make_frame(seed: int) -> Any:
    return pd.DataFrame({"a": np.arange(N // 4, dtype=np.float64) * seed, "b": "x"})


def make_bytes(seed: int) -> bytes:
    return bytes([seed]) * (8 << 20)


def make_small(seed: int) -> list[int]:
    return [seed] * 10


def describe(*values: Any) -> list[Any]:
    """What a task on the receiving worker saw of each argument."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, np.ndarray):
            v[0] = v[0]  # writable, as received by socket
            out.append(("array", float(v.sum()), v.flags.writeable))
        elif isinstance(v, pd.DataFrame):
            out.append(("frame", float(v.a.sum()), list(v.b.unique())))
        elif isinstance(v, bytes):
            out.append(("bytes", len(v), set(v[:: 1 << 16])))
        else:
            out.append(("other", v))
    return out


def lease_counts(dask_worker: Any) -> tuple[int, int]:
    return dask_worker.leases.made, len(dask_worker.leases)


def expire_leases_at_once(dask_worker: Any) -> None:
    dask_worker.leases.lease_seconds = 0.0


def expected(seed: int) -> list[Any]:
    return [
        ("array", float(np.arange(N, dtype=np.float64).sum() * seed), True),
        ("frame", float(np.arange(N // 4, dtype=np.float64).sum() * seed), ["x"]),
        ("bytes", 8 << 20, {seed}),
        ("other", [seed] * 10),
    ]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=2, threads_per_worker=1, timeout=60, validate=True) as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster, timeout=30) as c:
        yield c


def holders(client: Client) -> tuple[str, str]:
    a, b = sorted(client.scheduler_info()["workers"])
    return a, b


def made_on(client: Client, address: str) -> int:
    made, held = client.run(lease_counts, workers=[address])[address]
    assert held == 0  # every lease given back
    return made


def values_on(client: Client, address: str, seed: int) -> list[Any]:
    return [
        client.submit(f, seed, workers=[address], pure=False)
        for f in (make_array, make_frame, make_bytes, make_small)
    ]


def test_worker_to_worker_values_are_exact_and_leases_given_back(client: Client) -> None:
    a, b = holders(client)
    before = made_on(client, a)
    values = values_on(client, a, 3)
    wait(values)
    seen = client.submit(describe, *values, workers=[b], pure=False).result()
    assert seen == expected(3)
    assert made_on(client, a) == before + 1  # one GetData for all four, lent


def test_gather_to_the_client_is_exact(client: Client) -> None:
    a, _ = holders(client)
    before = made_on(client, a)
    values = values_on(client, a, 5)
    got = client.gather(values)
    assert describe(*got) == expected(5)
    assert made_on(client, a) == before + 1


def test_small_data_goes_by_socket(client: Client) -> None:
    a, b = holders(client)
    before = made_on(client, a)
    x = client.submit(make_small, 7, workers=[a], pure=False)
    assert client.submit(describe, x, workers=[b], pure=False).result() == [("other", [7] * 10)]
    assert x.result() == [7] * 10
    assert made_on(client, a) == before


def test_an_asker_with_the_path_off_is_sent_the_data(client: Client) -> None:
    a, _ = holders(client)
    before = made_on(client, a)
    values = values_on(client, a, 9)
    with dask.config.set({"shoal.comm.same-host-transfers": False}):
        got = client.gather(values)
    assert describe(*got) == expected(9)
    assert made_on(client, a) == before


def test_a_refused_copy_falls_back_to_the_socket_for_good(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = holders(client)
    calls = []

    def refuse(pid: int, *args: Any) -> None:
        calls.append(pid)
        raise cross_memory.CrossMemoryError(1, "Operation not permitted (test)")

    monkeypatch.setattr(cross_memory, "read_into", refuse)
    before = made_on(client, a)
    got = client.gather(values_on(client, a, 11))
    assert describe(*got) == expected(11)
    assert len(calls) == 1 and made_on(client, a) == before + 1  # lent once, given back
    # The connection no longer asks to borrow.
    got = client.gather(values_on(client, a, 12))
    assert describe(*got) == expected(12)
    assert len(calls) == 1 and made_on(client, a) == before + 1


def test_a_lease_that_lapsed_during_the_copy_is_not_trusted(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder let the lease go before the asker returned it: the asker discards
    what it copied (it may have read memory reused meanwhile) and asks again."""
    a, b = holders(client)
    client.run(expire_leases_at_once, workers=[a])
    copied = []
    real = cross_memory.read_into

    def scribble(pid: int, sources: Any, targets: list[memoryview]) -> None:
        real(pid, sources, targets)
        copied.append(pid)
        for t in targets:  # as if the memory had been reused: garbage
            t[: min(8, t.nbytes)] = b"\xff" * min(8, t.nbytes)

    monkeypatch.setattr(cross_memory, "read_into", scribble)
    try:
        got = client.gather(values_on(client, a, 13))
        assert describe(*got) == expected(13)  # not the scribbled copy
        assert copied  # the copy was made, and thrown away
        # Worker to worker, too (the receiving worker copies for real, then is refused).
        values = values_on(client, a, 14)
        wait(values)
        assert client.submit(describe, *values, workers=[b], pure=False).result() == expected(14)
    finally:
        client.run(
            lambda dask_worker: setattr(
                dask_worker.leases, "lease_seconds", same_host.LEASE_SECONDS
            ),
            workers=[a],
        )


def getpid() -> int:
    return os.getpid()


def test_a_holder_killed_during_the_copy_never_yields_its_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGKILL to the lender between the lease and the copy: whatever the copy reads (an
    error, or pages of another process under a reused PID) is never the result; the
    client gets the value recomputed on the surviving worker."""
    real = cross_memory.read_into
    killed = []

    def kill_then_read(pid: int, sources: Any, targets: list[memoryview]) -> None:
        if not killed:  # the first lender only: the recomputed value's copy is real
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        real(pid, sources, targets)  # raises, or reads a dying process

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, timeout=60) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        a, _ = holders(client)
        holder = client.submit(getpid, workers=[a], pure=False).result()
        x = client.submit(make_array, 17, workers=[a], allow_other_workers=True)
        wait([x])
        monkeypatch.setattr(cross_memory, "read_into", kill_then_read)
        value = x.result(timeout=60)
        monkeypatch.undo()
        assert killed == [holder]
        assert float(value.sum()) == float(np.arange(N, dtype=np.float64).sum() * 17)
        assert a not in client.scheduler_info()["workers"]
