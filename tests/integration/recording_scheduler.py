"""A real scheduler, run on a loop thread of the test process, that also records what
nannies and workers report about memory and exits (so tests can see that the
scheduler was told), whatever the scheduler itself does with those messages."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

from shoal.client.loop import LoopRunner
from shoal.comm.connection import Connection
from shoal.comm.tcp import HandshakeError, check_hello
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame
from shoal.server.scheduler import Scheduler

RECORDED = (m.WorkerExited, m.WorkerStatus, m.KeyUnserializable)


class RecordingScheduler(Scheduler):
    def __init__(self) -> None:
        super().__init__("127.0.0.1", 0, validate=True)
        self.reports: list[m.Message] = []
        self._lock = threading.Lock()

    def _record(self, frame: Frame) -> None:
        with self._lock:
            self.reports.extend(msg for msg in frame.messages if isinstance(msg, RECORDED))

    def recorded(self, kind: type[m.Message]) -> list[Any]:
        with self._lock:
            return [msg for msg in self.reports if type(msg) is kind]

    def _handshake(self, conn: Connection, frame: Frame) -> None:
        try:
            hello = check_hello(frame)
        except HandshakeError:
            super()._handshake(conn, frame)
            return
        super()._handshake(conn, frame)
        if hello.role in ("worker", "nanny") and not conn.closed:
            inner = conn.on_frame

            def on_frame(conn: Connection, frame: Frame) -> None:
                self._record(frame)
                inner(conn, frame)

            conn.on_frame = on_frame


S = TypeVar("S", bound=Scheduler)


@contextmanager
def on_a_loop_thread(scheduler: S, name: str) -> Iterator[S]:
    """``scheduler`` started on a loop thread of the test process, closed at the end."""
    runner = LoopRunner(name=name)
    try:
        runner.run_sync(scheduler.start(), 10)
        yield scheduler
    finally:
        runner.run_sync(scheduler.close(), 10)
        runner.stop()


def recording_scheduler() -> AbstractContextManager[RecordingScheduler]:
    return on_a_loop_thread(RecordingScheduler(), "recording-scheduler")


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.02)
