"""Progress watches of :class:`~shoal.core.scheduler.SchedulerState` (a mixin, like
placement): per-prefix counts of the tasks some keys need, kept as tasks finish.

A watch walks the keys' unfinished dependencies once, when it starts, and marks those
tasks. From then on each marked task tells the watch when it reaches memory, errs, or
is forgotten (in the ``TaskState.state`` setter), and the watch's counts go to its
client at most once an interval (:meth:`Progress.flush_progress`), so a progress bar
costs nothing per key and nothing is ever rescanned.
"""

from __future__ import annotations

from collections.abc import Iterator

from shoal.core.comm import Comm
from shoal.core.scheduler.model import FINISHED, ClientRecord, TaskState, added
from shoal.protocol import messages as m
from shoal.protocol.messages import Key


class ProgressWatch:
    __slots__ = ("id", "client", "counts", "left", "targets", "forgotten", "changed", "closed")

    def __init__(self, watch_id: int, client: str, changed: set[ProgressWatch]):
        self.id = watch_id
        self.client = client
        self.counts: dict[str, list[int]] = {}  # prefix -> [total, memory, erred]
        self.left = 0  # marked tasks not yet finished
        # The unfinished tasks of the keys asked for: once none is left the watch ends,
        # even if what they needed never runs (an error made it unnecessary).
        self.targets: set[TaskState] = set()
        self.forgotten = 0
        self.changed = changed  # the scheduler's set of watches with news to send
        self.closed = False

    def row(self, prefix: str) -> list[int]:
        """The counts of ``prefix``, with one more task in its total."""
        row = self.counts.get(prefix)
        if row is None:
            row = self.counts[prefix] = [0, 0, 0]
        row[0] += 1
        return row

    def finished(self, ts: TaskState, state: str) -> None:
        """A marked task reached memory, erred or was forgotten."""
        if self.closed:
            return
        if state == "memory":
            self.counts[ts.prefix.name][1] += 1
        elif state == "erred":
            self.counts[ts.prefix.name][2] += 1
        else:
            self.forgotten += 1
        self.left -= 1
        self.targets.discard(ts)
        self.changed.add(self)

    def message(self) -> m.ProgressCounts:
        return m.ProgressCounts(
            self.id,
            [m.PrefixProgress(name, *c) for name, c in self.counts.items()],
            self.forgotten,
            not self.targets,
        )

    def __repr__(self) -> str:
        return f"<ProgressWatch {self.client}/{self.id} left={self.left}>"


def _each_once(stack: list[TaskState], seen: set[TaskState]) -> Iterator[TaskState]:
    """Pop tasks off ``stack`` (which the caller may extend meanwhile), each task once."""
    while stack:
        ts = stack.pop()
        if ts not in seen:
            seen.add(ts)
            yield ts


class Progress:
    """Progress-watch methods and state of :class:`~shoal.core.scheduler.SchedulerState`."""

    tasks: dict[Key, TaskState]
    clients: dict[str, ClientRecord]
    comm: Comm

    def _init_progress(self) -> None:
        self.progress_changed: set[ProgressWatch] = set()

    def _watch_progress(self, cs: ClientRecord, msg: m.WatchProgress) -> None:
        old = cs.watches.pop(msg.watch_id, None)
        if old is not None:
            old.closed = True
        watch = ProgressWatch(msg.watch_id, cs.id, self.progress_changed)
        tasks = self.tasks
        stack = [ts for ts in map(tasks.get, msg.keys) if ts is not None]
        targets = watch.targets
        targets.update(ts for ts in stack if ts.state not in FINISHED)
        seen: set[TaskState] = set()
        below_finished: list[TaskState] = []
        # What is still needed: unfinished tasks, down to the finished ones, marked.
        for ts in _each_once(stack, seen):
            row = watch.row(ts.prefix.name)
            state = ts.state
            if state in FINISHED:
                row[1 if state == "memory" else 2] += 1
                below_finished.extend(ts.dependencies)
            else:
                ts.watches = added(ts.watches, watch)
                watch.left += 1
                stack.extend(ts.dependencies)
        # What finished tasks needed is done, even if its results were released since.
        for ts in _each_once(below_finished, seen):
            watch.row(ts.prefix.name)[2 if ts.state == "erred" else 1] += 1
            below_finished.extend(ts.dependencies)
        self.comm.send_client(cs.id, watch.message())
        if targets:
            cs.watches[watch.id] = watch
        else:
            watch.closed = True

    def _stop_progress(self, cs: ClientRecord, msg: m.StopProgress) -> None:
        watch = cs.watches.pop(msg.watch_id, None)
        if watch is not None:
            watch.closed = True  # its tasks drop it as they finish
            self.progress_changed.discard(watch)

    def _close_watches(self, cs: ClientRecord) -> None:
        for watch in cs.watches.values():
            watch.closed = True
            self.progress_changed.discard(watch)
        cs.watches.clear()

    def flush_progress(self) -> None:
        """Send every watch that changed since the last call its counts; a watch with
        nothing left to wait for sends its last message and ends."""
        changed = self.progress_changed
        while changed:
            watch = changed.pop()
            self.comm.send_client(watch.client, watch.message())
            if not watch.targets:
                watch.closed = True  # tasks still marked drop it as they finish
                cs = self.clients.get(watch.client)
                if cs is not None and cs.watches.get(watch.id) is watch:
                    del cs.watches[watch.id]
