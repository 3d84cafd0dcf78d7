"""``shoal.progress``: bars per task prefix fed by the counts the scheduler pushes, in a
terminal (tqdm) and in Jupyter (HTML redrawn in place); ``client.task_groups``."""

from __future__ import annotations

import asyncio
import io
import re
import sys
import threading
import time
import types
from html.parser import HTMLParser
from typing import Any

import pytest

from shoal import Client, LocalCluster, progress
from shoal.client.progress import HTMLProgress

pytestmark = pytest.mark.timeout(60)


def slow_inc(x: int) -> int:
    time.sleep(0.1)
    return x + 1


def double(x: int) -> int:
    return 2 * x


def fail_on_3(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x


def final_counts(text: str) -> dict[str, tuple[int, int]]:
    """The last ``n/total`` tqdm drew for each bar name."""
    out = {}
    for name, n, total in re.findall(r"([\w-]+): +\d+%\|[^|]*\| (\d+)/(\d+)", text):
        out[name] = (int(n), int(total))
    return out


def test_terminal_bars_per_prefix_update_live_and_finish(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster) as client:
        incs = client.map(slow_inc, range(20))
        doubles = client.map(double, incs)
        total = client.submit(sum, doubles)
        out = io.StringIO()
        progress(total, file=out)
        assert total.done() and total.result() == sum(2 * (i + 1) for i in range(20))
        text = out.getvalue()
        assert final_counts(text) == {"slow_inc": (20, 20), "double": (20, 20), "sum": (1, 1)}
        # drawn while running (20 x 0.1 s on two threads; counts every 0.2 s), not once
        seen = {int(n) for n in re.findall(r"slow_inc: +\d+%\|[^|]*\| (\d+)/20", text)}
        assert seen & set(range(1, 20)), text
        # the roots of the graph come first
        assert text.index("slow_inc") < text.index("double") < text.index("sum")


def test_one_bar_with_errors(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster) as client:
        futures = client.map(fail_on_3, range(6))
        out = io.StringIO()
        progress(futures, multi=False, file=out)
        assert all(f.done() for f in futures)
        text = out.getvalue()
        assert final_counts(text) == {"all": (6, 6)}
        assert "1 erred" in text


def test_progress_of_a_persisted_dask_collection(inproc_cluster: LocalCluster) -> None:
    da = pytest.importorskip("dask.array")
    with Client(inproc_cluster) as client:
        x = client.persist((da.ones((40,), chunks=4) + 1).sum())
        out = io.StringIO()
        progress(x, file=out)
        counts = final_counts(out.getvalue())
        assert len(counts) >= 2, counts
        assert all(n == total > 0 for n, total in counts.values()), counts
        assert float(x.compute()) == 80.0


def test_progress_with_an_asynchronous_client(inproc_cluster: LocalCluster) -> None:
    async def main() -> str:
        async with Client(inproc_cluster, asynchronous=True) as client:
            futures = client.map(slow_inc, range(4))
            out = io.StringIO()
            await progress(futures, file=out)
            assert [await f for f in futures] == [1, 2, 3, 4]
            return out.getvalue()

    assert final_counts(asyncio.run(main())) == {"slow_inc": (4, 4)}


def test_progress_of_done_futures_returns_at_once_or_leaves_them_out(
    inproc_cluster: LocalCluster,
) -> None:
    with Client(inproc_cluster) as client:
        futures = client.map(double, range(3))
        client.gather(futures)
        out = io.StringIO()
        progress(futures, file=out)
        assert final_counts(out.getvalue()) == {"double": (3, 3)}
        more = client.map(slow_inc, range(4))
        out = io.StringIO()
        progress([*futures, *more], complete=False, file=out)  # without the done ones
        assert final_counts(out.getvalue()) == {"slow_inc": (4, 4)}
        with pytest.raises(ValueError, match="needs futures"):
            progress([1, 2], file=out)


class _Handle:
    def __init__(self) -> None:
        self.updates: list[str] = []

    def update(self, obj: Any) -> None:
        self.updates.append(obj._repr_html_())


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open.pop() == tag, (tag, self.open)


def test_notebook_bars_redraw_a_display_in_place(
    inproc_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In Jupyter, IPython's ``display(obj, display_id=True)`` returns a handle whose
    ``update`` redraws the output; a stand-in records what each redraw would show."""
    handle = _Handle()
    shown: list[Any] = []

    def display(obj: Any, display_id: bool = False) -> _Handle:
        assert display_id
        shown.append(obj)
        return handle

    fake = types.ModuleType("IPython.display")
    fake.display = display  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", types.ModuleType("IPython"))
    monkeypatch.setitem(sys.modules, "IPython.display", fake)
    with Client(inproc_cluster) as client:
        futures = client.map(slow_inc, range(10))
        futures.append(client.submit(fail_on_3, 3))
        bar = progress(futures, notebook=True)
        assert isinstance(bar, HTMLProgress) and shown == [bar]
        assert bar.wait(timeout=20)
        assert handle.updates, "never redrawn"
        last = handle.updates[-1]
        assert "slow_inc" in last and "10 / 10" in last and "done" in last
        assert "1 / 1" in last and "1 erred" in last
        parser = _Tags()
        parser.feed(last)
        assert parser.open == []
        assert "slow_inc: 10/10" in repr(bar)


_GATE = threading.Event()


def wait_for_the_gate() -> bool:
    return _GATE.wait(30)


def test_a_bar_stops_when_the_client_closes(inproc_cluster: LocalCluster) -> None:
    # The task waits for the test (not a fixed sleep: on a loaded machine the bar's first
    # display can take longer than any sleep chosen here), so it cannot be done yet.
    _GATE.clear()
    client = Client(inproc_cluster)
    try:
        future = client.submit(wait_for_the_gate)
        bar = progress(future, notebook=True)
        assert not bar.wait(timeout=0.3)
    finally:
        client.close()
        _GATE.set()  # (the in-process worker's thread ends)
    assert bar.wait(timeout=5) and bar.watch.lost
    assert "lost the scheduler" in bar._repr_html_()


def test_task_groups_newest_first_per_prefix_and_limited(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster) as client:
        a = [client.submit(double, i, key=f"double-a{i}") for i in range(3)]
        b = client.submit(slow_inc, 1, key="slow_inc-1")
        mapped = client.map(double, range(10, 15))  # one call, one group
        client.gather([*a, b, *mapped])
        groups = client.task_groups()
        [map_group] = [name for name in groups if name.startswith("double-") and len(name) > 9]
        assert list(groups) == [map_group, "slow_inc-1", "double-a2", "double-a1", "double-a0"]
        assert groups[map_group]["states"] == {"memory": 5}
        assert groups["slow_inc-1"]["states"] == {"memory": 1}
        assert groups["slow_inc-1"]["duration_count"] == 1
        assert list(client.task_groups("double", limit=2)) == [map_group, "double-a2"]
        assert list(client.task_groups(limit=1)) == [map_group]
        assert client.task_groups("nothing") == {}
        assert set(client.task_prefixes()) >= {"double", "slow_inc"}
