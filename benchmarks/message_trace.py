"""A message trace of shoal's connections, for profiling (not part of shoal).

``install(path)`` wraps :class:`shoal.comm.connection.Connection` in this process so
that every frame written (``flush``, ``send_frame``) and every frame dispatched
(``_dispatch``) appends one JSON line to ``path``: wall time, pid, role, direction,
the two ends' addresses, and a short summary of each message (type, key or count).
Wall time (``time.time()``) is what workers stamp on ``TaskFinished.start/stop``, so
one compute can be followed across processes on one machine.

Child processes pick it up through :func:`write_sitecustomize`: a ``sitecustomize``
module on their ``PYTHONPATH`` that installs the trace when ``SHOAL_TRACE_DIR`` is set.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ENV = "SHOAL_TRACE_DIR"

_SITECUSTOMIZE = """\
import os, sys
if os.environ.get({env!r}):
    try:
        from benchmarks.message_trace import install_from_env
        install_from_env()
    except Exception as e:  # a trace must never stop the process
        print("message trace not installed:", repr(e), file=sys.stderr)
"""


def write_sitecustomize(directory: Path) -> Path:
    """A ``sitecustomize.py`` in ``directory`` (to go first on children's PYTHONPATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sitecustomize.py"
    path.write_text(_SITECUSTOMIZE.format(env=ENV))
    return path


def role_of(argv: list[str]) -> str:
    for name in ("scheduler", "worker", "nanny"):
        if name in argv[1:3]:
            return name
    return "client"


def install_from_env() -> None:
    directory = Path(os.environ[ENV])
    install(directory / f"trace-{os.getpid()}.jsonl", role_of(sys.argv))


def _summary(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(msg).__name__}
    key = getattr(msg, "key", None)
    if key is not None:
        out["key"] = str(key)
    for name in ("keys", "tasks", "wanted"):
        value = getattr(msg, name, None)
        if isinstance(value, list):
            out[name] = len(value)
    for name in ("start", "stop"):  # TaskFinished: when the worker ran it
        value = getattr(msg, name, None)
        if isinstance(value, float):
            out[name] = value
    payload = getattr(msg, "payload", None) or getattr(msg, "value", None)
    data = getattr(payload, "data", None)
    if isinstance(data, bytes | bytearray | memoryview):
        out["payload_bytes"] = len(data)
    return out


_lock = threading.Lock()


def install(path: Path, role: str) -> None:
    """Wrap Connection's frame writes and dispatch in this process."""
    from shoal.comm import connection

    cls = connection.Connection
    if getattr(cls, "_traced", False):
        return
    fh = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    pid = os.getpid()

    def ends(conn: Any) -> tuple[str, str]:
        transport = conn.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        return (f"{local[0]}:{local[1]}" if local else "?", conn.peer)

    def record(conn: Any, direction: str, msgs: list[Any], t: float, note: str = "") -> None:
        local, peer = ends(conn)
        line = {
            "t": t,
            "pid": pid,
            "role": role,
            "dir": direction,
            "local": local,
            "peer": peer,
            "msgs": [_summary(x) for x in msgs],
        }
        if note:
            line["note"] = note
        with _lock:
            fh.write(json.dumps(line) + "\n")

    flush, send_frame, dispatch = cls.flush, cls.send_frame, cls._dispatch
    write_direct = cls.write_direct

    def traced_flush(self: Any) -> None:
        out, t = list(self._out), time.time()  # stamped before the write, as sent
        may = self.handshake is None or self.handshake.may_send
        flush(self)
        if out and may and not self.closed and self.transport is not None:
            record(self, "out", out, t)

    def traced_send_frame(self: Any, pieces: list[Any], messages: int = 1) -> None:
        t = time.time()
        send_frame(self, pieces, messages)
        record(self, "out", [], t, note=f"pre-encoded frame of {messages} message(s)")

    def traced_write_direct(self: Any, msgs: list[Any]) -> bool:
        t = time.time()  # a calling thread's frame, written on the socket itself
        written = write_direct(self, msgs)
        if written:
            record(self, "out", list(msgs), t)
        return written

    def traced_dispatch(self: Any, frame: Any) -> None:
        record(self, "in", list(frame.messages), time.time())
        dispatch(self, frame)

    cls.flush = traced_flush  # type: ignore[method-assign]
    cls.send_frame = traced_send_frame  # type: ignore[method-assign]
    cls._dispatch = traced_dispatch  # type: ignore[method-assign]
    cls.write_direct = traced_write_direct  # type: ignore[method-assign]
    cls._traced = True  # type: ignore[attr-defined]


def read_trace(directory: Path) -> list[dict[str, Any]]:
    """Every line of every process's trace, in time order."""
    lines = []
    for path in sorted(directory.glob("trace-*.jsonl")):
        for text in path.read_text().splitlines():
            if text.strip():
                lines.append(json.loads(text))
    lines.sort(key=lambda line: line["t"])
    return lines
