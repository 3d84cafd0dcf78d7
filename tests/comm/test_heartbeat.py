"""keep_alive: beats at the interval the replies give, asks for a reply only once per
quarter of the timeout (the other beats carry request id 0), and gives up on a silent
scheduler. Driven against a stand-in connection: no network, no scheduler."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from shoal.comm.connection import CommClosedError
from shoal.comm.heartbeat import keep_alive
from shoal.protocol import messages as m

pytestmark = pytest.mark.timeout(30)


class FakeConn:
    def __init__(self, answer: bool = True, interval: float = 0.05):
        self.answer = answer
        self.interval = interval
        self.closed = False
        self.aborted = ""
        self.beats: list[tuple[float, int]] = []  # (time, request id) of every beat
        self._ids = itertools.count(1)

    def send(self, msg: m.Message) -> None:
        assert isinstance(msg, m.Heartbeat)
        self.beats.append((asyncio.get_running_loop().time(), msg.request_id))

    async def request(self, make, timeout=None):
        msg = make(next(self._ids))
        self.send(msg)
        if not self.answer:
            await asyncio.sleep(timeout)
            raise TimeoutError
        return m.HeartbeatReply(msg.request_id, self.interval), []

    def abort(self, reason: str) -> None:
        self.aborted = reason
        self.closed = True


def test_only_one_beat_per_quarter_timeout_asks_for_a_reply() -> None:
    async def main() -> FakeConn:
        conn = FakeConn(interval=0.05)
        task = asyncio.ensure_future(keep_alive(conn, m.Heartbeat, 0.8, 0.05))  # type: ignore[arg-type]
        await asyncio.sleep(1.0)
        conn.closed = True
        await asyncio.wait_for(task, 1)
        return conn

    conn = asyncio.run(main())
    asked = [t for t, rid in conn.beats if rid]
    quiet = [t for t, rid in conn.beats if not rid]
    assert 15 <= len(conn.beats) <= 21  # every 0.05 s for 1 s
    assert 4 <= len(asked) <= 6  # every 0.2 s: a quarter of the 0.8 s timeout
    assert len(quiet) >= 2 * len(asked)
    assert all(b - a >= 0.19 for a, b in itertools.pairwise(asked))
    assert not conn.aborted


def test_a_silent_scheduler_is_given_up_on() -> None:
    async def main() -> FakeConn:
        conn = FakeConn(answer=False)
        await asyncio.wait_for(keep_alive(conn, m.Heartbeat, 0.3, 0.05), 5)  # type: ignore[arg-type]
        return conn

    conn = asyncio.run(main())
    assert conn.aborted == "the scheduler did not answer for 0.3s"


def test_a_closed_connection_ends_the_beats() -> None:
    class Closing(FakeConn):
        async def request(self, make, timeout=None):
            raise CommClosedError("gone")

    async def main() -> None:
        await asyncio.wait_for(keep_alive(Closing(), m.Heartbeat, 1.0, 0.05), 5)  # type: ignore[arg-type]

    asyncio.run(main())
