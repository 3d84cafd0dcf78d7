"""The worker writes a task's TaskFinished before the loop moves on: ``_drain_results``
(the loop's step for finished tasks) flushes the scheduler connection, rather than
leaving the frame for the next loop iteration."""

from __future__ import annotations

import asyncio
import socket

from shoal.comm.connection import Connection
from shoal.core.worker.state import ExecuteSuccess, WorkerState
from shoal.protocol import messages as m
from shoal.protocol.framing import FrameDecoder
from shoal.protocol.messages import ComputeTask, Payload
from shoal.server.worker import Worker

ARGS = Payload(0, b"\x92\x90\x80")


def test_drain_results_writes_task_finished_before_returning():
    async def main() -> list[m.Message]:
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        loop = asyncio.get_running_loop()
        conn = Connection()
        await loop.connect_accepted_socket(lambda: conn, sock=ours)
        worker = Worker("tcp://127.0.0.1:1", memory_limit=0)
        worker._loop, worker.scheduler = loop, conn
        worker.state = WorkerState(1, "tcp://127.0.0.1:2", validate=True)
        worker._handle([ComputeTask("k", "f", ARGS, (0,), [], "compute-k")])
        worker._queue.get_nowait()  # the thread's part: no thread here
        conn.flush()  # (nothing was queued to send yet)
        done = ExecuteSuccess("k", 42, 28, None, "int", 1.0, 2.0, "done-k")
        worker._push_result(done)  # as a task thread does
        worker._drain_results()  # as the loop then does: no await in between
        try:
            data = theirs.recv(1 << 16)  # already written: no loop iteration ran
        except BlockingIOError:
            data = b""  # nothing written yet
        finally:
            conn.close()
            theirs.close()
        frames = FrameDecoder(1 << 20).feed(data)
        return [msg for frame in frames for msg in frame.messages]

    sent = asyncio.run(asyncio.wait_for(main(), 10))
    assert [(type(msg), msg.key) for msg in sent] == [(m.TaskFinished, "k")]
