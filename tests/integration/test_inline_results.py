"""Small results of wanted keys come inline with their completion; larger ones are
fetched from the holders the completion notice names, without asking WhoHas."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from inline_tasks import fails_if_exists, sized_bytes
from recording_scheduler import on_a_loop_thread, wait_for

from shoal import Client
from shoal.comm.connection import Connection
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame
from shoal.server.scheduler import Scheduler

pytestmark = pytest.mark.timeout(90)
KIB = 1024


class CountingScheduler(Scheduler):
    """A real scheduler that counts the messages it receives, by type."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1", 0, validate=True)
        self.received: Counter[str] = Counter()
        self.finished: list[m.TaskFinished] = []
        self._lock = threading.Lock()

    def _handshake(self, conn: Connection, frame: Frame) -> None:
        super()._handshake(conn, frame)
        inner = conn.on_frame

        def on_frame(conn: Connection, frame: Frame) -> None:
            with self._lock:
                for msg in frame.messages:
                    self.received[type(msg).__name__] += 1
                    if type(msg) is m.TaskFinished:
                        self.finished.append(msg)
            inner(conn, frame)

        conn.on_frame = on_frame

    def count(self, kind: str) -> int:
        with self._lock:
            return self.received[kind]


def counting_scheduler() -> AbstractContextManager[CountingScheduler]:
    return on_a_loop_thread(CountingScheduler(), "counting-scheduler")


@pytest.fixture
def two_workers(spawn: Callable[..., Any]) -> Iterator[tuple[CountingScheduler, list[Any]]]:
    with counting_scheduler() as s:
        procs = [spawn("worker", s.address, "--name", name) for name in ("wa", "wb")]
        yield s, procs


def small_frame() -> pd.DataFrame:
    return pd.DataFrame({"a": np.arange(100), "b": np.linspace(0, 1, 100), "c": ["x"] * 100})


VALUES: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
    ("float64", np.float64, (1.5,)),
    ("int32", np.int32, (7,)),
    ("bool_", np.bool_, (True,)),
    ("datetime64", np.datetime64, ("2026-01-02",)),
    ("array", np.arange, (50,)),
    ("array 80 KB", np.ones, ((100, 100),)),  # its buffer reaches the writer as a PickleBuffer
    ("series", pd.Series, (list(range(100)),)),
    ("frame", small_frame, ()),
    ("tuple", tuple, ([1, "a", None],)),
    ("str 5000", str.__mul__, ("y", 5000)),
    ("bytes 255 KiB", sized_bytes, (255 * KIB,)),
    ("bytes 257 KiB", sized_bytes, (257 * KIB,)),
]


def expected(func: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return func(*args)


def assert_same(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if isinstance(want, pd.DataFrame | pd.Series):
        assert got.equals(want) and list(got.index) == list(want.index)
        if isinstance(want, pd.DataFrame):
            assert list(got.dtypes) == list(want.dtypes)
        else:
            assert got.dtype == want.dtype
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    else:
        assert got == want


def test_every_type_comes_back_exactly(two_workers: Any) -> None:
    s, _ = two_workers
    with Client(s.address, timeout=30) as client:
        client.wait_for_workers(2, timeout=20)
        futures = [client.submit(func, *args, pure=False) for _, func, args in VALUES]
        gathered = client.gather(futures)
        for (_, func, args), f, got in zip(VALUES, futures, gathered):
            want = expected(func, args)
            assert_same(got, want)
            assert_same(f.result(), want)
        # what came inline and what did not: 256 KiB (the default) is the line
        inline = {msg.key: msg.value for msg in s.finished}
        by_name = {name: inline[f.key] for (name, _, _), f in zip(VALUES, futures)}
        assert by_name["bytes 257 KiB"] is None
        assert all(v is not None for k, v in by_name.items() if k != "bytes 257 KiB")


def test_a_task_error_is_raised_as_before(two_workers: Any) -> None:
    s, _ = two_workers
    with Client(s.address, timeout=30) as client:
        f = client.submit(int, "not a number")
        with pytest.raises(ValueError, match="not a number"):
            f.result()
        with pytest.raises(ValueError, match="not a number"):
            client.gather([client.submit(np.float64, 2.0), f])
        assert client.gather([f], errors="skip") == []


def test_each_result_call_returns_an_object_of_its_own(two_workers: Any) -> None:
    s, _ = two_workers
    with Client(s.address, timeout=30) as client:
        f = client.submit(pd.Series, [1.0, 2.0, 3.0])
        first = f.result()
        first.iloc[0] = 99.0
        assert f.result().tolist() == [1.0, 2.0, 3.0]
        assert client.gather(f) is not client.gather(f)
        arr = client.submit(np.zeros, 4)
        a = arr.result()
        a[:] = 5
        assert arr.result().tolist() == [0.0] * 4


def test_a_small_compute_asks_no_whohas(two_workers: Any) -> None:
    s, _ = two_workers
    with Client(s.address, timeout=30) as client:
        client.wait_for_workers(2, timeout=20)
        assert client.submit(np.float64, 1.5).result() == np.float64(1.5)
        series = client.submit(pd.Series, list(range(100)))
        assert client.gather(series).sum() == 4950
        x = client.submit(np.arange, 10)
        total = client.submit(np.sum, x)  # x is not wanted... but it is held: a future
        assert total.result() == 45
        assert s.count("WhoHasRequest") == 0
        # a value too large to inline is fetched from the holder the notice names
        big = client.submit(sized_bytes, 257 * KIB)
        assert big.result() == b"x" * (257 * KIB)
        assert s.count("WhoHasRequest") == 0
        assert s.count("SubmitTasks") >= 4


def test_only_wanted_keys_are_inlined_beyond_plain_values(two_workers: Any) -> None:
    s, _ = two_workers
    with Client(s.address, timeout=30) as client:
        import dask

        @dask.delayed(pure=True)
        def series(n: int) -> pd.Series:
            return pd.Series(range(n))

        @dask.delayed(pure=True)
        def total(x: pd.Series) -> np.int64:
            return x.sum()

        part = series(10)
        (result,) = client.compute([total(part)], sync=True)
        assert result == 45
        values = {msg.key: msg.value for msg in s.finished}
        assert values[part.key] is None  # an intermediate: not sent to the scheduler
        assert s.count("WhoHasRequest") == 0


def test_a_key_wanted_by_two_clients(two_workers: Any) -> None:
    s, _ = two_workers
    with Client(s.address, timeout=30) as c1, Client(s.address, timeout=30) as c2:
        both = [c.submit(pd.Series, [1, 2, 3], key="shared-series") for c in (c1, c2)]
        assert [f.result().tolist() for f in both] == [[1, 2, 3], [1, 2, 3]]
        # a third wants it once it is in memory: no inline value then, but its holders
        later = c2.submit(np.float64, 4.25, key="shared-float")
        assert later.result() == 4.25
        again = c1.submit(np.float64, 4.25, key="shared-float")
        assert again.result() == 4.25
        assert s.count("WhoHasRequest") == 0
        assert len([msg for msg in s.finished if msg.key == "shared-float"]) == 1


def test_a_result_lost_after_inline_delivery(spawn: Callable[..., Any], tmp_path: Path) -> None:
    flag = tmp_path / "recomputed"
    with counting_scheduler() as s, Client(s.address, timeout=30) as client:
        first = spawn("worker", s.address, "--name", "wa")
        kept = client.submit(np.float64, 3.5)
        failing = client.submit(fails_if_exists, str(flag), 7)
        assert kept.result() == 3.5 and failing.result() == 7  # both inline, both on "wa"
        spawn("worker", s.address, "--name", "wb")
        client.wait_for_workers(2, timeout=20)
        flag.touch()
        first.kill()  # the keys are wanted: recomputed on "wb", where one of them fails
        wait_for(lambda: failing.status == "error", 30, "the recomputation to fail")
        with pytest.raises(ValueError, match="recomputed"):
            failing.result()
        with pytest.raises(ValueError, match="recomputed"):
            client.gather([kept, failing])
        assert kept.result() == 3.5
        assert client.submit(np.add, kept, 1.0).result() == 4.5  # it is on "wb" again
        assert s.count("WhoHasRequest") == 0


def test_results_through_the_asynchronous_client(two_workers: Any) -> None:
    s, _ = two_workers

    async def main() -> None:
        async with Client(s.address, asynchronous=True, timeout=30) as client:
            f = client.submit(pd.Series, [1, 2])
            assert (await f).tolist() == [1, 2]
            big = client.submit(sized_bytes, 257 * KIB)
            assert await client.gather(big) == b"x" * (257 * KIB)
            assert (await client.gather([f]))[0] is not (await f)

    asyncio.run(main())
    assert s.count("WhoHasRequest") == 0


def test_inline_results_can_be_turned_off(spawn: Callable[..., Any]) -> None:
    with counting_scheduler() as s:
        env = dict(child_env_with(SHOAL_WORKER__INLINE_RESULTS_BYTES="0"))
        spawn("worker", s.address, env=env)
        with Client(s.address, timeout=30) as client:
            assert client.submit(np.float64, 1.5).result() == 1.5
            assert client.submit(int, "5").result() == 5
        values = [msg.value for msg in s.finished]
        assert values[0] is None and values[1] is not None  # plain values still inline
        assert s.count("WhoHasRequest") == 0  # the holder came with the notice


def child_env_with(**extra: str) -> dict[str, str]:
    from subprocess_env import child_env

    env = child_env()
    env.update(extra)
    return env


def test_the_client_holds_inline_values_up_to_a_bound(
    two_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shoal.client import client as client_module

    s, _ = two_workers
    monkeypatch.setattr(client_module, "INLINE_HELD_MAX", 3000)
    with Client(s.address, timeout=30) as client:
        futures = [client.submit(pd.Series, [float(i)] * 100) for i in range(4)]
        values = client.gather(futures)
        assert [v.tolist() for v in values] == [[float(i)] * 100 for i in range(4)]
        held = [client._states[f.key].inline for f in futures]
        sizes = [len(p.data) for p in held if p is not None]
        assert 0 < len(sizes) < 4 and sum(sizes) == client._inline_held <= 3000
        assert [f.result().tolist() for f in futures] == [[float(i)] * 100 for i in range(4)]
        del futures, values
        wait_for(lambda: client._inline_held == 0, 10, "released values to be counted out")
