"""A worker's data transfers: fetching dependencies from peers (``GatherDep``),
serving its data to peers and clients (``GetData``), receiving scattered data
(``UpdateData``), and the handshake and dispatch of peer connections. A mixin of
:class:`~shoal.server.worker.Worker`: like it, it translates and never decides
(the decisions are :class:`~shoal.core.worker.state.WorkerState`'s)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from shoal.comm.connection import CommClosedError, Connection
from shoal.comm.pool import ConnectionPool
from shoal.comm.same_host import DataLeases, fetch_data, reply_with_data
from shoal.comm.tcp import HandshakeError, check_hello
from shoal.core.worker.state import (
    GatherDep,
    GatherFailure,
    GatherSuccess,
    TransferError,
    UpdateDataEvent,
    WorkerState,
)
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame, ProtocolError, message_buffers
from shoal.protocol.serialize import (
    SerializationError,
    dumps_exception,
    dumps_value,
    loads_values,
    sizeof,
)
from shoal.server import remote_run
from shoal.server.transfers import TransferTotals

if TYPE_CHECKING:
    from shoal.lanes._worker import WorkerLanes
    from shoal.server.actors import ActorServer
    from shoal.shuffle._worker import ShuffleService

logger = logging.getLogger("shoal.worker")

GATHER_TIMEOUT = 60.0

# Held while user objects (task functions, arguments, data from peers) are unpickled:
# unpickling imports the modules they name, and two threads importing numpy, pandas,
# dask.array... for the first time at once can deadlock in the import system
# (``_DeadlockError``) and leave a module half-imported for good in this process.
# One lock per process (several in-process workers share the import system); an
# RLock, as a payload's function references load functions while it is held.
DESERIALISE_LOCK = threading.RLock()


class WorkerTransferMixin:
    address: str
    id: str
    state: WorkerState | None
    transfers: TransferTotals
    leases: DataLeases
    shuffle: ShuffleService
    actors: ActorServer
    lanes: WorkerLanes
    _peers: ConnectionPool
    _closed: asyncio.Event
    _stimulus: itertools.count[int]

    if TYPE_CHECKING:

        def _handle(self, events: list[Any]) -> None: ...

        def _report_unserializable(self, failed: list[tuple[Any, str]]) -> None: ...

    async def _gather(self, inst: GatherDep) -> None:
        stimulus_id = f"gather-{next(self._stimulus)}"
        try:
            conn = await self._peers.get(inst.worker)
            reply, buffers = await fetch_data(conn, list(inst.keys), timeout=GATHER_TIMEOUT)
            with DESERIALISE_LOCK:  # on the loop: a task thread may be importing meanwhile
                data, errors = loads_values(reply.keys, reply.payloads, buffers)
            nbytes = {key: sizeof(value) for key, value in data.items()}
            if nbytes:
                self.transfers.received(sum(nbytes.values()))
            event: Any = GatherSuccess(
                worker=inst.worker,
                data=data,
                nbytes=nbytes,
                missing=list(reply.missing),
                stimulus_id=stimulus_id,
                failed=self._transfer_errors(inst.worker, reply.failed, errors),
            )
        except (TimeoutError, OSError, CommClosedError, HandshakeError, AssertionError) as e:
            logger.info("could not gather %s from %s: %s", inst.keys, inst.worker, e)
            event = GatherFailure(worker=inst.worker, keys=list(inst.keys), stimulus_id=stimulus_id)
        if not self._closed.is_set():
            self._handle([event])

    def _transfer_errors(
        self, holder: str, unsendable: list[tuple[Any, str]], unloadable: dict[Any, Exception]
    ) -> dict[Any, TransferError]:
        """Keys whose data came not, and never will: the holder could not pickle them,
        or we could not unpickle them (the original exception, with a note naming the
        key and both workers, is what their tasks err with)."""
        failed = {}
        for key, reason in unsendable:
            exc: Exception = SerializationError(
                f"the result of {key!r} cannot be sent from {holder} to {self.address}: {reason}"
            )
            failed[key] = TransferError(
                f"{holder} cannot pickle it: {reason}", dumps_exception(exc)
            )
        for key, exc in unloadable.items():
            exc.add_note(f"raised loading the result of {key!r} from {holder} on {self.address}")
            reason = f"{self.address} cannot unpickle it: {type(exc).__name__}: {exc}"
            failed[key] = TransferError(reason, dumps_exception(exc))
        return failed

    def _accept_peer(self, conn: Connection) -> None:
        def handshake(conn: Connection, frame: Frame) -> None:
            try:
                hello = check_hello(frame)
            except HandshakeError as e:
                conn.abort(str(e))
                return
            if hello.role not in ("peer", "client"):
                conn.abort(f"a worker does not accept role {hello.role!r}")
                return
            conn.send(m.Welcome(m.PROTOCOL_VERSION, self.id, self.address))
            conn.set_handler(self._on_peer_frame)

        conn.set_handler(handshake)

    def _on_peer_frame(self, conn: Connection, frame: Frame) -> None:
        assert self.state is not None
        for msg, bufs in message_buffers(frame):
            if type(msg) is m.GetData:
                self._serve_data(conn, msg)
            elif type(msg) is m.ReturnLease:
                self.leases.answer(conn, msg)
            elif type(msg) is m.UpdateData:
                self._receive_data(conn, msg, bufs)
            elif type(msg) is m.ShuffleData:
                self.shuffle.receive(conn, msg, bufs)
            elif type(msg) is m.RunFunction:  # client.run
                remote_run.answer(conn, msg, "dask_worker", self)
            elif type(msg) is m.ActorCall:
                self.actors.handle(conn, msg)
            elif type(msg) is m.LaneRun:  # a client's one-task get (shoal/lanes)
                self.lanes.on_run(conn, msg)
            elif type(msg) is m.LaneRunGraph:  # a client's small graph (shoal/lanes)
                self.lanes.on_run_graph(conn, msg)
            else:
                raise ProtocolError(f"a peer may not send {type(msg).__name__}")

    def _serve_data(self, conn: Connection, msg: m.GetData) -> None:
        assert self.state is not None
        data = self.state.data
        keys, payloads, buffers, missing, failed = [], [], [], [], []
        sent = 0
        for key in msg.keys:
            if key not in data:
                missing.append(key)
                continue
            try:
                payload, bufs = dumps_value(data[key])
            except SerializationError as e:  # one bad value must not sink the others
                failed.append((key, str(e)))
                continue
            keys.append(key)
            payloads.append(payload)
            buffers.extend(bufs)
            ts = self.state.tasks.get(key)
            sent += ts.nbytes if ts is not None else 0
        if keys:
            self.transfers.sent(sent)
        reply = m.DataReply(msg.request_id, keys, payloads, missing, failed)
        reply_with_data(conn, self.leases, msg, reply, buffers)
        if failed:  # the scheduler errs these tasks: no one can ever get their results
            self._report_unserializable(failed)

    def _receive_data(self, conn: Connection, msg: m.UpdateData, buffers: list[memoryview]) -> None:
        with DESERIALISE_LOCK:
            data, errors = loads_values(msg.keys, msg.payloads, buffers)
        for key, exc in errors.items():  # the client's scatter fails with this reason
            raise SerializationError(
                f"scattered data {key!r} cannot be unpickled on worker {self.address}: "
                f"{type(exc).__name__}: {exc}"
            )
        nbytes = {key: sizeof(value) for key, value in data.items()}
        self._handle(
            [UpdateDataEvent(data=data, nbytes=nbytes, stimulus_id=f"update-data-{time.time()}")]
        )
        conn.send(m.Ack(msg.request_id, [nbytes[k] for k in msg.keys]))
