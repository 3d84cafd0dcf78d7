"""Data that cannot travel, and keys that cannot be found: results that cannot be
pickled or unpickled, dependencies too large for the worker that needs them, and NaN
keys. Real worker processes over TCP; every case must end in a clear error, never a
wrong result or a hang, and the cluster must go on working."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bad_input import Processes, procs, raw_connect_and_hello  # noqa: F401 (a fixture)

import shoal
from shoal import Client, LocalCluster

pytestmark = pytest.mark.timeout(120)


def inc(x: int) -> int:
    return x + 1


def make_lock(i: int) -> object:
    return [threading.Lock(), i]


def use(x: object) -> str:
    return f"used {type(x).__name__}"


def _explode_on_load(message: str) -> None:
    raise ValueError(message)


class Unloadable:
    """Pickles fine; unpickling calls a function that raises (as an object whose class
    moved, or whose reduction needs something the loading process lacks)."""

    def __reduce__(self) -> object:
        return (_explode_on_load, ("this value cannot be loaded",))


def make_unloadable(i: int) -> Unloadable:
    return Unloadable()


def make_bytes(n: int) -> bytes:
    return b"x" * n


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


@pytest.fixture(scope="module")
def two_workers() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=2, threads_per_worker=1, timeout=60, validate=True) as c:
        yield c


@pytest.fixture
def client(two_workers: LocalCluster) -> Iterator[tuple[Client, str, str]]:
    with Client(two_workers, timeout=30) as c:
        a, b = sorted(c.scheduler_info()["workers"])
        yield c, a, b
        # whatever happened, both workers still compute, and with each other's data
        x = c.submit(inc, 1, workers=[a], pure=False)
        assert c.submit(inc, x, workers=[b], pure=False).result(timeout=30) == 3


def test_unsendable_result_never_becomes_a_result(client: tuple[Client, str, str]) -> None:
    """A result that cannot be pickled, needed by a task restricted to another worker:
    the receiving worker once registered its stand-in for the value as a copy, and
    when the scheduler heard of it before the holder's "cannot pickle" notice,
    ``result()`` *returned* the stand-in (2 of 12 runs). Now nothing stands in for
    data that never came: both futures raise, every time, and the workers go on."""
    c, a, b = client
    for i in range(12):
        lock = c.submit(make_lock, i, workers=[a], pure=False)
        dependent = c.submit(use, lock, workers=[b], pure=False)
        with pytest.raises(shoal.SerializationError) as dep_error:
            dependent.result(timeout=30)
        assert repr(lock.key) in str(dep_error.value)
        with pytest.raises(shoal.SerializationError, match="cannot be"):
            lock.result(timeout=30)
        # the worker that could not receive it runs later tasks, and so does the holder
        assert c.submit(inc, i, workers=[b], pure=False).result(timeout=30) == i + 1
        assert c.submit(inc, i, workers=[a], pure=False).result(timeout=30) == i + 1


def test_unloadable_result_errs_on_the_client(client: tuple[Client, str, str]) -> None:
    """Unpickling the result raises: ``result()`` raises that very exception, naming
    the key (it used to wait forever, asking the worker again and again)."""
    c, a, _ = client
    f = c.submit(make_unloadable, 1, workers=[a], pure=False)
    with pytest.raises(ValueError, match="this value cannot be loaded") as info:
        f.result(timeout=30)
    assert repr(f.key) in notes(info.value)
    with pytest.raises(ValueError, match="this value cannot be loaded"):
        c.gather([f])  # and again: an error, not a retry loop


def test_unloadable_dependency_errs_its_dependent(client: tuple[Client, str, str]) -> None:
    """The dependent runs on another worker, which cannot load the dependency: it errs
    with the original exception, blamed on the dependency, once (not reported missing,
    recomputed and sent again without end)."""
    c, a, b = client
    x = c.submit(make_unloadable, 2, workers=[a], pure=False)
    y = c.submit(use, x, workers=[b], pure=False)
    with pytest.raises(ValueError, match="this value cannot be loaded") as info:
        y.result(timeout=30)
    assert repr(x.key) in notes(info.value)
    assert b in notes(info.value)  # the worker that could not load it
    with pytest.raises(ValueError, match="this value cannot be loaded"):
        x.result(timeout=30)


def test_nan_keys_are_refused_at_submission(client: tuple[Client, str, str]) -> None:
    """A NaN key never equals itself: once accepted it stayed "processing" forever and
    held its thread; two of them blocked a one-thread worker for good."""
    c, _, _ = client
    for key in (float("nan"), ("x", float("nan")), ("x", 1, (math.nan,))):
        with pytest.raises(TypeError, match="NaN is not equal to itself") as info:
            c.submit(inc, 1, key=key)
        assert "nan" in str(info.value)
    with pytest.raises(TypeError, match="NaN"):
        c.map(inc, [1, 2], key=["ok", float("nan")])
    with pytest.raises(TypeError, match="NaN"):
        c.scatter({float("nan"): 1})
    with pytest.raises(TypeError, match="invalid key"):
        c.submit(inc, 1, key=("x", None))  # as Dask: no None inside a key


def test_nan_key_from_a_hostile_client_closes_only_its_connection(procs: Processes) -> None:  # noqa: F811
    """A client that skips the check and sends a NaN key on the wire is refused (its
    connection closes, naming the key); the scheduler and the worker go on."""
    task = [("x", math.nan), "f", [0, b"\x92\x90\x80", 0]]
    with raw_connect_and_hello(procs.address) as peer:
        peer.send_raw_body([["SubmitTasks", [task], [("x", math.nan)], {}, "hostile"]])
        peer.expect_refused("NaN is not equal to itself")
    procs.assert_working()


def test_dependency_larger_than_the_receivers_memory_limit(spawn: object, tmp_path: Path) -> None:
    """Worker b's memory limit is smaller than a result it needs from worker a: the
    dependent errs at once with a MemoryError naming the key, its size and the limit,
    instead of fetching it (and being killed for memory) or fetching it forever."""
    from test_faults import start_scheduler

    _, address = start_scheduler(spawn, tmp_path, "--validate")  # type: ignore[arg-type]
    spawn("worker", address, "--name", "big", "--memory-limit", "2GB", "--validate")  # type: ignore[operator]
    spawn(  # type: ignore[operator]
        # (no HTTP port: aiohttp's 12 MB would pause a worker this small before it starts)
        *("worker", address, "--name", "small", "--memory-limit", "60MB", "--validate"),
        "--no-dashboard",
    )
    with Client(address, timeout=30) as c:
        c.wait_for_workers(2, timeout=30)
        big = c.submit(make_bytes, 100_000_000, workers=["big"], pure=False)
        shoal.wait([big], timeout=30)
        out = c.submit(len, big, workers=["small"], pure=False)
        with pytest.raises(MemoryError) as info:
            out.result(timeout=30)
        text = str(info.value)
        assert repr(big.key) in text and "memory limit" in text and "60000000" in text
        assert len(big.result(timeout=60)) == 100_000_000  # the key itself is fine
        assert c.submit(inc, 1, workers=["small"], pure=False).result(timeout=30) == 2
