"""The scheduler process: connections in, :class:`SchedulerState` decides.

This shell only translates: it runs the handshake, feeds each decoded batch to the
core, answers read-only queries, and implements the core's ``Comm`` by queueing
messages on connections (one frame per destination per loop iteration).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import logging
import os
import uuid
from pathlib import Path

from shoal.comm.connection import Connection
from shoal.comm.tcp import HandshakeError, check_hello, listen
from shoal.core.scheduler import SchedulerState
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame, ProtocolError

logger = logging.getLogger("shoal.scheduler")


def tune_gc() -> None:
    """Servers create and drop many small records per task; the default thresholds
    make the cyclic collector rescan them constantly (half the scheduler's time in a
    measurement). Collect young objects less often, and never rescan startup objects."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 50)


class Scheduler:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        validate: bool = False,
        owns_process: bool = False,
    ):
        self.owns_process = owns_process  # the CLI's scheduler may tune process-wide settings
        self.host = host
        self.port = port
        self.id = f"scheduler-{uuid.uuid4().hex[:12]}"
        self.state = SchedulerState(self, validate=validate)
        self.address = ""
        self._server: asyncio.Server | None = None
        self._workers: dict[str, Connection] = {}
        self._clients: dict[str, Connection] = {}
        self._client_ids = itertools.count(1)
        self._closed = asyncio.Event()
        self._stimulus = itertools.count(1)

    # ---------------------------------------------------------------- Comm (for the core)

    def send_worker(self, address: str, msg: m.Message) -> None:
        conn = self._workers.get(address)
        if conn is None:
            return
        if type(msg) is m.FreeKeys:
            last = conn.last_queued()
            if type(last) is m.FreeKeys:  # adjacent: merging keeps the order of events
                last.keys.extend(msg.keys)
                return
        conn.send(msg)

    def send_client(self, client_id: str, msg: m.Message) -> None:
        conn = self._clients.get(client_id)
        if conn is not None:
            conn.send(msg)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> Scheduler:
        if self.owns_process:
            tune_gc()
            Connection.fatal_on_invalid_state = self.state.validate
        self._server, self.address = await listen(self.host, self.port, self._accept)
        logger.info("scheduler at %s", self.address)
        return self

    def write_scheduler_file(self, path: str | os.PathLike[str]) -> None:
        data = {"address": self.address, "id": self.id, "pid": os.getpid()}
        tmp = Path(f"{path}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)  # atomic: readers never see half a file

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in [*self._workers.values(), *self._clients.values()]:
            conn.close()
        self._closed.set()

    async def finished(self) -> None:
        await self._closed.wait()

    def _sid(self, what: str) -> str:
        return f"{what}-{next(self._stimulus)}"

    # ---------------------------------------------------------------- connections

    def _accept(self, conn: Connection) -> None:
        conn.set_handler(self._handshake)

    def _handshake(self, conn: Connection, frame: Frame) -> None:
        try:
            hello = check_hello(frame)
        except HandshakeError as e:
            conn.abort(str(e))
            return
        if hello.role == "worker":
            self._add_worker(conn, hello)
        elif hello.role == "client":
            self._add_client(conn, hello)
        elif hello.role == "nanny":  # INTERIM (branch nanny): the lead's scheduler replaces this
            self._add_nanny_interim(conn, hello)
        else:
            conn.abort(f"the scheduler does not accept role {hello.role!r}")

    def _add_worker(self, conn: Connection, hello: m.Hello) -> None:
        address = hello.address
        if not address or address in self._workers:
            conn.abort(f"invalid or duplicate worker address {address!r}")
            return
        if hello.nthreads < 1:
            conn.abort(f"a worker needs at least one thread, not {hello.nthreads}")
            return
        self._workers[address] = conn
        conn.send(m.Welcome(m.PROTOCOL_VERSION, self.id, hello.name or address))

        def on_frame(conn: Connection, frame: Frame) -> None:
            # INTERIM (branch nanny): the core does not know these yet; logged, not applied
            interim = (m.WorkerStatus, m.KeyUnserializable)
            for msg in frame.messages:
                if isinstance(msg, interim):
                    logger.info("worker %s: %r (not handled yet)", address, msg)
            msgs = [msg for msg in frame.messages if not isinstance(msg, interim)]
            if not msgs:
                return
            try:
                self.state.handle_worker(address, *msgs)
            except TypeError as e:
                raise ProtocolError(str(e)) from None

        def on_close(conn: Connection, exc: BaseException | None) -> None:
            if self._workers.get(address) is conn:
                del self._workers[address]
                self.state.remove_worker(address, self._sid("worker-closed"))
                logger.info("worker %s left: %s", address, conn.close_reason)

        conn.on_close = on_close
        conn.set_handler(on_frame)
        self.state.add_worker(
            address,
            hello.name,
            hello.nthreads,
            hello.memory_limit,
            self._sid("worker-joined"),
            hello.resources,
        )
        logger.info(
            "worker %s joined (%d threads, resources %s)", address, hello.nthreads, hello.resources
        )

    def _add_nanny_interim(self, conn: Connection, hello: m.Hello) -> None:
        """INTERIM (branch nanny): welcome a nanny and log its WorkerExited reports."""
        conn.send(m.Welcome(m.PROTOCOL_VERSION, self.id, hello.name))

        def on_frame(conn: Connection, frame: Frame) -> None:
            for msg in frame.messages:
                if not isinstance(msg, m.WorkerExited):
                    raise ProtocolError(f"a nanny may not send {type(msg).__name__}")
                logger.info("nanny %s: %r", hello.name, msg)

        conn.set_handler(on_frame)

    def _add_client(self, conn: Connection, hello: m.Hello) -> None:
        client_id = f"client-{next(self._client_ids)}-{hello.name or 'anonymous'}"
        self._clients[client_id] = conn
        self.state.add_client(client_id)
        conn.send(m.Welcome(m.PROTOCOL_VERSION, self.id, client_id))

        def on_frame(conn: Connection, frame: Frame) -> None:
            batch: list[m.Message] = []
            for msg in frame.messages:
                if isinstance(msg, m.WhoHasRequest | m.InfoRequest):
                    if batch:
                        self._client_batch(client_id, batch)
                        batch = []
                    conn.send(self._answer(msg))
                else:
                    batch.append(msg)
            if batch:
                self._client_batch(client_id, batch)

        def on_close(conn: Connection, exc: BaseException | None) -> None:
            if self._clients.pop(client_id, None) is not None:
                self.state.remove_client(client_id, self._sid("client-closed"))

        conn.on_close = on_close
        conn.set_handler(on_frame)

    def _client_batch(self, client_id: str, batch: list[m.Message]) -> None:
        try:
            self.state.handle_client(client_id, *batch)
        except TypeError as e:
            raise ProtocolError(str(e)) from None

    def _answer(self, msg: m.WhoHasRequest | m.InfoRequest) -> m.Message:
        if isinstance(msg, m.WhoHasRequest):
            return m.WhoHasReply(msg.request_id, self.state.who_has(msg.keys))
        return m.InfoReply(
            msg.request_id, self.id, self.address, self.state.worker_infos(), len(self.state.tasks)
        )
