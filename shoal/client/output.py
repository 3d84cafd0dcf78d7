"""The output of a client's tasks, received (``shoal/server/output.py`` captures it on
the workers): printed text goes to this process's ``sys.stdout``/``sys.stderr`` and log
records to the logger of the same name here, at once, each naming the worker; warnings
are raised again, with their original category, when a result is gathered.

A warning belongs to the gather of its own key or, for an intermediate task of a graph
(a key this client holds no future of), to the next gather: a task's output reaches
the client before any result computed after it, so ``x.compute()`` re-raises the
warnings of the tasks that made ``x``. ``Client(forward_output=False)`` turns it off.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from shoal.protocol import messages as m
from shoal.protocol.messages import Key

MAX_PENDING_WARNINGS = 1000  # warnings kept for gathers to come; the oldest go first

_decoder = msgspec.msgpack.Decoder()


class PendingWarning:
    __slots__ = ("key", "worker", "message", "category", "filename", "lineno")

    def __init__(
        self, key: Key, worker: str, message: str, category: str, filename: str, lineno: int
    ):
        self.key = key
        self.worker = worker
        self.message = message
        self.category = category
        self.filename = filename
        self.lineno = lineno


class OutputReceiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._warnings: list[PendingWarning] = []

    def received(self, msg: m.TaskOutput) -> None:
        """Show text and log records now; keep warnings for the gather."""
        try:
            entries = _decoder.decode(msg.data)
        except msgspec.DecodeError:
            logging.getLogger(__name__).warning(
                "unreadable output of task %r from %s", msg.key, msg.worker
            )
            return
        for entry in entries:
            kind = entry[0]
            if kind in ("stdout", "stderr"):
                _write(sys.stdout if kind == "stdout" else sys.stderr, msg.worker, entry[1])
            elif kind == "log":
                _, text, name, levelno, created = entry
                record = logging.makeLogRecord(
                    {
                        "name": name,
                        "levelno": levelno,
                        "levelname": logging.getLevelName(levelno),
                        "msg": f"[{msg.worker}] {text}",
                        "created": created,
                        "worker": msg.worker,
                        "key": msg.key,
                    }
                )
                logger = logging.getLogger(name)
                if logger.isEnabledFor(levelno):
                    logger.handle(record)
            elif kind == "warning":
                _, text, category, filename, lineno = entry
                with self._lock:
                    self._warnings.append(
                        PendingWarning(msg.key, msg.worker, text, category, filename, lineno)
                    )
                    del self._warnings[:-MAX_PENDING_WARNINGS]

    def reraise(self, keys: Iterable[Key], held: Mapping[Key, Any]) -> None:
        """Raise again the warnings of ``keys`` (just gathered) and of tasks whose keys
        this client holds no future of (``held``)."""
        if not self._warnings:
            return
        gathered = set(keys)
        with self._lock:
            due = [w for w in self._warnings if w.key in gathered or w.key not in held]
            if not due:
                return
            self._warnings = [
                w for w in self._warnings if not (w.key in gathered or w.key not in held)
            ]
        for w in due:
            warnings.warn_explicit(w.message, _category(w.category), w.filename, w.lineno)


def _write(stream: Any, worker: str, text: str) -> None:
    lines = text.splitlines(keepends=True)
    stream.write("".join(f"[{worker}] {line}" for line in lines))
    if lines and not lines[-1].endswith("\n"):
        stream.write("\n")


def _category(name: str) -> type[Warning]:
    """The warning class named ``module:qualname``; UserWarning if it cannot be had."""
    module, _, qualname = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:
        return UserWarning
    if isinstance(obj, type) and issubclass(obj, Warning):
        return obj
    return UserWarning
