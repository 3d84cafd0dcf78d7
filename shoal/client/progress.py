"""Progress bars over futures or persisted collections, one per task prefix.

The scheduler counts, per prefix, the tasks the futures need and pushes the counts when
they change (at most every 0.2 s; see :mod:`shoal.core.scheduler.progress`), so a bar costs no
polling and nothing per key. In a terminal the bars are tqdm's; in Jupyter an HTML
table that updates itself in place.
"""

from __future__ import annotations

import asyncio
import html
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from shoal.client.futures import Future
from shoal.protocol import messages as m

if TYPE_CHECKING:
    from shoal.client.client import Client


@dataclass(frozen=True)
class Row:
    name: str  # a task prefix, or "all" for the single bar
    total: int
    memory: int
    erred: int

    @property
    def done(self) -> int:
        return self.memory + self.erred


def futures_of(obj: Any) -> list[Future]:
    """The futures in ``obj``: a future, a (nested) list, tuple, set or dict of them,
    or a dask collection persisted on shoal."""
    out: dict[int, Future] = {}

    def walk(x: Any) -> None:
        if isinstance(x, Future):
            out.setdefault(id(x), x)
        elif isinstance(x, list | tuple | set | frozenset):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)
        elif hasattr(x, "__dask_graph__"):
            graph = x.__dask_graph__()
            if graph is not None:
                for y in graph.values():
                    walk(y)

    walk(obj)
    return list(out.values())


class Watch:
    """The latest counts of one scheduler watch, for a thread or a coroutine to wait on.
    The client calls :meth:`_on_counts` on its loop as counts arrive."""

    def __init__(self, client: Client, keys: list[Any], complete: bool = True):
        self.client = client
        self.complete = complete  # False: leave out what was done before the watch
        self._before: dict[str, tuple[int, int]] = {}  # prefix -> (memory, erred) then
        self.latest: m.ProgressCounts | None = None
        self.lost = False  # the scheduler went away (or the client closed) first
        self.updates = 0
        self.listeners: list[Callable[[], None]] = []
        self._cond = threading.Condition()
        self._changed: asyncio.Event | None = None
        if client.asynchronous:
            self._changed = asyncio.Event()
        self.id = client._watch_progress(keys, self._on_counts)

    @property
    def finished(self) -> bool:
        return self.lost or (self.latest is not None and self.latest.finished)

    def rows(self, multi: bool = True) -> list[Row]:
        """Per prefix, the roots of the graph first (the scheduler lists them from the
        keys down); or one row for everything."""
        msg = self.latest
        if msg is None:
            return []
        rows = []
        for p in reversed(msg.prefixes):
            memory, erred = self._before.get(p.name, (0, 0))
            if p.total > memory + erred:  # all done before (complete=False): no bar
                rows.append(
                    Row(p.name, p.total - memory - erred, p.memory - memory, p.erred - erred)
                )
        if multi:
            return rows
        return [
            Row(
                "all",
                sum(r.total for r in rows),
                sum(r.memory for r in rows),
                sum(r.erred for r in rows),
            )
        ]

    def _on_counts(self, msg: m.ProgressCounts | None) -> None:
        with self._cond:
            if msg is None:
                self.lost = True
            else:
                if self.latest is None and not self.complete:
                    self._before = {p.name: (p.memory, p.erred) for p in msg.prefixes}
                self.latest = msg
            self.updates += 1
            self._cond.notify_all()
        if self._changed is not None:
            self._changed.set()
        for listener in self.listeners:
            listener()

    def wait(self, seen: int, timeout: float) -> int:
        """Block until more than ``seen`` updates arrived, or ``timeout``; the count."""
        with self._cond:
            self._cond.wait_for(lambda: self.updates > seen, timeout)
            return self.updates

    async def wait_async(self) -> None:
        assert self._changed is not None
        await self._changed.wait()
        self._changed.clear()

    def stop(self) -> None:
        if not self.finished:
            self.client._unwatch_progress(self.id)


# ------------------------------------------------------------------------ terminal


class TextProgress:
    """tqdm bars, one per prefix (or one for all), drawn on ``file``."""

    def __init__(self, multi: bool = True, file: IO[str] | None = None):
        from tqdm import tqdm

        class Bar(tqdm):
            monitor_interval = 0  # no monitor thread: nothing outlives the bars

        self._tqdm = Bar
        self.multi = multi
        self.file = file
        self.bars: dict[str, Any] = {}

    def update(self, watch: Watch) -> None:
        for row in watch.rows(self.multi):
            bar = self.bars.get(row.name)
            if bar is None:
                bar = self.bars[row.name] = self._tqdm(
                    total=row.total,
                    initial=row.done,  # done before the bar: not in its rate
                    desc=row.name,
                    unit="task",
                    position=len(self.bars),
                    leave=True,
                    file=self.file,
                    dynamic_ncols=self.file is None,
                )
            bar.n = row.done
            if row.erred:
                bar.set_postfix_str(f"{row.erred} erred", refresh=False)
            bar.refresh()

    def close(self, watch: Watch) -> None:
        self.update(watch)
        for bar in self.bars.values():
            bar.close()
        if watch.lost and self.file is not None:
            print("progress stopped: the client lost its scheduler", file=self.file)


# ------------------------------------------------------------------------ Jupyter


class HTMLProgress:
    """A table of bars that Jupyter shows, and redraws in place as counts arrive."""

    def __init__(self, watch: Watch, multi: bool = True):
        self.watch = watch
        self.multi = multi
        self.started = time.monotonic()
        self.elapsed = 0.0
        self._handle: Any = None
        self._done = threading.Event()
        watch.listeners.append(self._changed)
        if watch.finished:
            self._done.set()

    def show(self) -> HTMLProgress:
        try:
            from IPython.display import display
        except ImportError:
            return self
        self._handle = display(self, display_id=True)
        return self

    def _changed(self) -> None:
        if not self._done.is_set():  # the clock stops when the bars are complete
            self.elapsed = time.monotonic() - self.started
            if self.watch.finished:
                self._done.set()
        if self._handle is not None:
            self._handle.update(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the bars are complete (or ``timeout``); whether they are."""
        return self._done.wait(timeout)

    def __repr__(self) -> str:
        rows = ", ".join(f"{r.name}: {r.done}/{r.total}" for r in self.watch.rows(self.multi))
        return f"<Progress {rows or 'waiting'}>"

    def _repr_html_(self) -> str:
        return "".join(self._html())

    def _html(self) -> Iterator[str]:
        yield '<table class="shoal-progress" style="border-collapse:collapse">'
        for row in self.watch.rows(self.multi):
            ok = 100 * row.memory / row.total if row.total else 100.0
            bad = 100 * row.erred / row.total if row.total else 0.0
            erred = f' <span style="color:#c0392b">{row.erred} erred</span>' if row.erred else ""
            yield (
                "<tr>"
                f'<td style="text-align:right;padding-right:1em">{html.escape(row.name)}</td>'
                '<td style="width:20em"><div style="display:flex;height:1em;background:#eee">'
                f'<div class="done" style="width:{ok:.1f}%;background:#2e86c1"></div>'
                f'<div class="erred" style="width:{bad:.1f}%;background:#c0392b"></div>'
                "</div></td>"
                f'<td style="padding-left:1em">{row.done} / {row.total}{erred}</td>'
                "</tr>"
            )
        state = (
            "lost the scheduler"
            if self.watch.lost
            else ("done" if self.watch.finished else "running")
        )
        yield f'<tr><td colspan="3">{state}, {self.elapsed:.1f} s</td></tr></table>'


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (a terminal IPython is not one). A kernel
    has imported IPython already; importing it here would cost most of a second."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if get_ipython is not None else None
    return shell is not None and hasattr(shell, "kernel")


# ------------------------------------------------------------------------ the function


def progress(
    *futures: Any,
    notebook: bool | None = None,
    multi: bool = True,
    complete: bool = True,
    file: IO[str] | None = None,
) -> Any:
    """Show the progress of futures (or persisted dask collections), per task prefix.

    In a terminal this blocks until they are done (or failed), drawing tqdm bars on
    ``file`` (stderr by default); with an asynchronous client it returns an awaitable
    doing the same. In Jupyter (``notebook=True``, detected by default) it returns at
    once an object that displays itself as bars updated in place. ``multi=False``
    shows one bar for all tasks instead of one per prefix; ``complete=False`` leaves
    out the tasks already done when the bars start."""
    found = futures_of(futures)
    if not found:
        raise ValueError("progress() needs futures, or dask collections persisted on shoal")
    client = found[0].client
    keys = list(dict.fromkeys(f.key for f in found))
    if notebook is None:
        notebook = in_notebook()
    watch = Watch(client, keys, complete)
    if notebook:
        return HTMLProgress(watch, multi).show()
    bars = TextProgress(multi, file)
    if client.asynchronous:
        return _draw_async(watch, bars)
    _draw(watch, bars)
    return None


def _draw(watch: Watch, bars: TextProgress) -> None:
    seen = 0
    try:
        while not watch.finished:
            # A timeout, so that Ctrl-C reaches a waiting main thread.
            seen = watch.wait(seen, 0.5)
            bars.update(watch)
    finally:
        watch.stop()
        bars.close(watch)


async def _draw_async(watch: Watch, bars: TextProgress) -> None:
    try:
        while not watch.finished:
            await watch.wait_async()
            bars.update(watch)
    finally:
        watch.stop()
        bars.close(watch)
