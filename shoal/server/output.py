"""Task output on a worker: what tasks print (``sys.stdout``/``sys.stderr``), the
warnings they raise and the log records they make, captured per task thread and sent to
the scheduler (which forwards it to the task's client: ``shoal/client/output.py``).

Installed once per process (:func:`install`), never per task:

- ``sys.stdout`` and ``sys.stderr`` become :class:`_ThreadStream` proxies: a write on a
  thread that runs a task is captured, any other write goes to the original stream.
- A logging handler on the root logger captures the records made on a task thread
  (those that pass their loggers' levels, as for any handler).
- ``warnings.showwarning`` is replaced, and the filters' "default"/"module"/"once"
  actions (and ``warnings.defaultaction``) become "always", once: the warnings module's
  filters and its once-per-location registries are process-wide, so no per-task
  ``catch_warnings`` (which would change them under the tasks of other threads); a task
  thread's warnings are captured, each distinct one once per task, so that every task's
  client gets them, and the worker's own warnings are shown once per location as
  before. "ignore" and "error" filters keep working.

Bounded: at most :data:`OUTPUT_BYTES_PER_INTERVAL` bytes of text per
:data:`OUTPUT_INTERVAL` for the whole worker (a task printing in a loop does not flood
the scheduler); the rest is dropped and a note says how much. Sent in batches: one
:class:`~shoal.protocol.messages.TaskOutput` per task with output per interval, and the
rest of a task's output just before its result.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import warnings
from typing import Any, TextIO

import msgspec

from shoal.protocol import messages as m

OUTPUT_INTERVAL = 0.2  # seconds between sends of what running tasks wrote
OUTPUT_BYTES_PER_INTERVAL = 64 * 1024  # text a worker forwards per interval, at most
MAX_WARNINGS_PER_TASK = 100

_task = threading.local()  # .key: the task this thread runs, while it runs
_encoder = msgspec.msgpack.Encoder()


class OutputCollector:
    """What the tasks of this worker wrote, by key, until sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[Any, list[list[Any]]] = {}  # key -> entries, in order
        self._warned: dict[Any, set[tuple[Any, ...]]] = {}  # key -> warnings it sent
        self._dropped: dict[Any, int] = {}  # key -> bytes dropped this interval
        self._budget = OUTPUT_BYTES_PER_INTERVAL

    # -- from task threads --

    def add_text(self, key: Any, stream: str, text: str) -> None:
        with self._lock:
            if len(text) > self._budget:
                self._dropped[key] = self._dropped.get(key, 0) + len(text) - self._budget
                text = text[: self._budget]
            self._budget -= len(text)
            if text:
                entries = self._pending.setdefault(key, [])
                if entries and entries[-1][0] == stream:
                    entries[-1][1] += text  # one entry per run of writes to one stream
                else:
                    entries.append([stream, text])

    def add_log(self, key: Any, record: logging.LogRecord, text: str) -> None:
        with self._lock:
            if len(text) > self._budget:
                self._dropped[key] = self._dropped.get(key, 0) + len(text)
                return
            self._budget -= len(text)
            entry = ["log", text, record.name, record.levelno, record.created]
            self._pending.setdefault(key, []).append(entry)

    def add_warning(
        self, key: Any, category: type[Warning], text: str, filename: str, lineno: int
    ) -> None:
        ident = (category, text, filename, lineno)
        with self._lock:
            seen = self._warned.setdefault(key, set())
            if ident in seen or len(seen) >= MAX_WARNINGS_PER_TASK:
                return
            seen.add(ident)
            name = f"{category.__module__}:{category.__qualname__}"
            entry = ["warning", text, name, filename, lineno]
            self._pending.setdefault(key, []).append(entry)

    def begin(self, key: Any) -> None:
        """This thread now runs ``key``: what it writes is that task's."""
        _task.key = key

    def end(self, key: Any) -> None:
        _task.key = None
        if self._warned:  # (mostly empty: no lock per task then)
            with self._lock:
                self._warned.pop(key, None)

    # -- from the worker's loop --

    def take_task(self, key: Any) -> bytes:
        """What ``key`` wrote, encoded as a TaskOutput's data (b"" if nothing): a lane's
        task answers its client with its output (shoal/lanes)."""
        if key not in self._pending and key not in self._dropped:
            return b""
        with self._lock:
            entries = self._pending.pop(key, [])
            dropped = self._dropped.pop(key, 0)
        if dropped:
            entries.append(["stderr", _dropped_note(dropped)])
        return _encoder.encode(entries) if entries else b""

    def take(self, refill: bool = False) -> list[m.TaskOutput]:
        """The messages to send now (and, each interval, a new byte budget)."""
        if not refill and not self._pending and not self._dropped:
            return []  # after every batch of results: nothing to lock for, mostly
        with self._lock:
            pending, self._pending = self._pending, {}
            dropped, self._dropped = self._dropped, {}
            if refill:
                self._budget = OUTPUT_BYTES_PER_INTERVAL
        for key, n in dropped.items():
            pending.setdefault(key, []).append(["stderr", _dropped_note(n)])
        return [m.TaskOutput(key, "", _encoder.encode(entries)) for key, entries in pending.items()]


def _dropped_note(n: int) -> str:
    return (
        f"[shoal: {n} characters of this task's output dropped: a worker forwards "
        f"at most {OUTPUT_BYTES_PER_INTERVAL} per {OUTPUT_INTERVAL}s]\n"
    )


class _ThreadStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr``: a task thread's writes are captured."""

    def __init__(self, original: TextIO, name: str, collector: OutputCollector):
        self._original = original
        self._name = name
        self._collector = collector

    def write(self, text: str) -> int:
        key = getattr(_task, "key", None)
        if key is None:
            return self._original.write(text)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._collector.add_text(key, self._name, text)
        return len(text)

    def flush(self) -> None:
        if getattr(_task, "key", None) is None:
            self._original.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return getattr(_task, "key", None) is None and self._original.isatty()

    def fileno(self) -> int:
        return self._original.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:  # buffer, errors, ...: the original's
        return getattr(self._original, name)


class _TaskLogHandler(logging.Handler):
    def __init__(self, collector: OutputCollector):
        super().__init__()
        self._collector = collector

    def emit(self, record: logging.LogRecord) -> None:
        key = getattr(_task, "key", None)
        if key is not None:
            try:
                self._collector.add_log(key, record, record.getMessage())
            except Exception:
                self.handleError(record)


_installed: OutputCollector | None = None
_install_lock = threading.Lock()


def install() -> OutputCollector:
    """Capture task output in this process (once; later calls return the same)."""
    global _installed
    with _install_lock:
        if _installed is not None:
            return _installed
        collector = OutputCollector()
        sys.stdout = _ThreadStream(sys.stdout, "stdout", collector)
        sys.stderr = _ThreadStream(sys.stderr, "stderr", collector)
        logging.getLogger().addHandler(_TaskLogHandler(collector))
        _install_warnings(collector)
        _installed = collector
        return collector


def _install_warnings(collector: OutputCollector) -> None:
    original = warnings.showwarning
    shown: set[tuple[Any, ...]] = set()  # the worker's own: once per location, as "default"
    lock = threading.Lock()

    def showwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        key = getattr(_task, "key", None)
        if key is not None:
            collector.add_warning(key, category, str(message), filename, lineno)
            return
        with lock:
            where = (category, str(message), filename, lineno)
            if where in shown:
                return
            shown.add(where)
        original(message, category, filename, lineno, file, line)

    # Every warning reaches showwarning, which decides (filters stay process-wide).
    filters: Any = warnings.filters  # (a list: typeshed says Sequence)
    filters[:] = [
        ("always", *f[1:]) if f[0] in ("default", "module", "once") else f for f in warnings.filters
    ]
    warnings.defaultaction = "always"  # type: ignore[attr-defined]
    warnings._filters_mutated()  # type: ignore[attr-defined]
    warnings.showwarning = showwarning
