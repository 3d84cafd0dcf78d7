"""The Client: submit work, hold futures, gather results.

Serialisation happens in the caller's thread; everything that touches the
connection happens on the client's event loop (a background thread for the
synchronous API). Messages from other threads go through an ordered outbox that
is flushed in one loop callback, so a burst of ``submit`` calls costs one wake-up
and one frame.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shoal.client.cluster_info import ClusterInfo
from shoal.client.construction import (
    ConstructionMixin,
    address_from_scheduler_file,
    check_cluster_kwargs,
)
from shoal.client.data_location import DataLocationMixin
from shoal.client.datasets import DatasetsMixin
from shoal.client.futures import Future, FutureState
from shoal.client.gather import GatherMixin
from shoal.client.graph import collections
from shoal.client.graph.dask_graph import GraphEncoder
from shoal.client.graph.data import GraphDataCache
from shoal.client.graph.order_cache import OrderCache
from shoal.client.loop import LoopRunner, in_thread
from shoal.client.output import OutputReceiver
from shoal.client.pins import PinsMixin
from shoal.client.plugins import PluginsMixin
from shoal.client.remote import RemoteMixin
from shoal.client.restart import RestartMixin
from shoal.client.submit import SubmitMixin
from shoal.client.task_stream import TaskStreamMixin
from shoal.comm.connection import CommClosedError, Connection
from shoal.comm.heartbeat import keep_alive
from shoal.comm.pool import ConnectionPool
from shoal.comm.security import Security
from shoal.comm.tcp import connect
from shoal.config import CONFIGURED, resolve
from shoal.lanes._client import ClientLanes
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame, ProtocolError
from shoal.protocol.messages import Key
from shoal.protocol.serialize import (
    FunctionTable,
    SerializationError,
    loads_value,
)

logger = logging.getLogger("shoal.client")
_LATE_REPLIES = (
    *(m.HeartbeatReply, m.RetireReply, m.WhoHasReply, m.InfoReply, m.GroupsReply),
    *(m.PinReply, m.EventsReply, m.PluginReply, m.RunReply, m.DatasetReply),
    m.TaskStreamReply,
    *(m.RebalanceReply, m.HasWhatReply),
)
T = TypeVar("T")
# Inline results a client holds at most, in all (each at most the workers' limit,
# shoal.worker.inline-results-bytes); past this, results are fetched when gathered.
INLINE_HELD_MAX = 256 * 2**20
# A submission of at most this many tasks is written from the calling thread (_send).
DIRECT_SUBMIT_TASKS = 32
# Clients of this process that may be connected: closed at exit before the clusters
# (shoal.deploy.local), so that a cluster closing under them is no "lost scheduler".
_live_clients: weakref.WeakSet[Client] = weakref.WeakSet()


def close_live_clients() -> None:
    for client in list(_live_clients):
        try:
            if client.asynchronous:
                client._abandon()
            else:
                client.close()
        except Exception:  # at exit: one client's failure must not keep others open
            logger.debug("closing %r at exit failed", client, exc_info=True)


class Client(
    ConstructionMixin,
    ClusterInfo,
    DataLocationMixin,
    DatasetsMixin,
    GatherMixin,
    RemoteMixin,
    RestartMixin,
    PinsMixin,
    PluginsMixin,
    SubmitMixin,
    TaskStreamMixin,
):
    """Connect to a scheduler (an address, a cluster object, the address in
    ``scheduler_file``, or a new ``LocalCluster`` when none is given, started with
    ``cluster_kwargs`` such as ``n_workers``, ``threads_per_worker``, ``processes``,
    ``memory_limit``) and submit work to it.

    ``security`` (token, TLS): by default the cluster object's, else that of a
    ``LocalCluster`` of this process at that address, else from the environment
    (``SHOAL_TOKEN``, ``SHOAL_TLS_*``)."""

    def __init__(
        self,
        address: Any = None,
        *,
        asynchronous: bool = False,
        timeout: float = CONFIGURED,
        name: str = "",
        set_as_default: bool = True,
        scheduler_timeout: float = CONFIGURED,
        subscribe: bool = True,
        security: Security | None = None,
        forward_output: bool = True,
        scheduler_file: str | os.PathLike[str] | None = None,
        **cluster_kwargs: Any,
    ):
        if scheduler_file is not None:
            if address is not None:
                raise TypeError("Client takes an address or a scheduler_file, not both")
            address = address_from_scheduler_file(scheduler_file)
        check_cluster_kwargs(address, cluster_kwargs)
        self._cluster_kwargs = cluster_kwargs
        self._asynchronous = asynchronous
        # Tasks' prints, log records and warnings come here (shoal/client/output.py).
        self.forward_output = forward_output
        self._output = OutputReceiver()
        self.security = security
        # Left out: from the config (shoal.comm.timeouts.*, or distributed.comm.timeouts.*)
        timeout = resolve(timeout, "comm.timeouts.connect")
        scheduler_timeout = resolve(scheduler_timeout, "comm.timeouts.scheduler")
        self.timeout = timeout
        # Seconds without an answer to a heartbeat before the scheduler counts as gone
        # (a frozen or unreachable scheduler closes no connection for us).
        self.scheduler_timeout = scheduler_timeout
        self._heartbeats: asyncio.Task[None] | None = None
        # Gets the cluster summary pushed; not clients inside tasks (get_client), which
        # would multiply the pushes by the number of workers.
        self._subscribed = subscribe
        self._summary: m.ClusterState | None = None
        self._chain: m.ClusterState | None = None
        self._summary_changed: asyncio.Future[None] | None = None
        self._watchers: dict[int, Callable[[m.ProgressCounts | None], None]] = {}
        self._watch_ids = itertools.count(1)
        self.name = name or f"pid{os.getpid()}"
        self.id = ""
        self.dashboard_port = 0
        self.cluster: Any = None
        self._own_cluster = False
        self._address_arg = address
        self.scheduler_address = ""
        self.status = "newly-created"
        self._closed = False  # close() ran (status may say "closed" earlier: scheduler lost)
        self._conn: Connection | None = None
        self._functions = FunctionTable()
        self._sent_functions: set[str] = set()
        self._states: dict[Key, FutureState] = {}
        self._refs: dict[Key, int] = {}
        self._refs_lock = threading.Lock()
        self._inline_held = 0  # bytes of inline values the futures' states hold
        self._cancels = 0  # cancel calls so far; the n-th one's stimulus_id is "cancel-n-..."
        self._outbox: deque[m.Message] = deque()
        self._outbox_lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self._submits = itertools.count(1)
        self._wakeup_scheduled = False
        self._worker_conns = ConnectionPool(
            lambda: m.Hello(m.PROTOCOL_VERSION, "client", name=self.id), timeout
        )
        self._callback_pool: ThreadPoolExecutor | None = None
        self._scatter_rr = itertools.count()
        self._runner: LoopRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ref_types: dict[type, Callable[[Any], Key]] = {Future: _future_key}
        self._encoder: GraphEncoder | None = None
        # dask.order's orders of graphs submitted before, by structure (order_cache.py)
        self._orders = OrderCache()
        self._lanes = ClientLanes(self)  # one-task gets straight to a worker (shoal/lanes)
        # Large constants of Dask graphs, placed on the workers once (client/graph/data.py)
        self.graph_data = GraphDataCache(self)
        self._set_as_default = set_as_default
        if not asynchronous:
            self._runner = LoopRunner()
            self._loop = self._runner.loop
            try:
                self._runner.run_sync(self._start(), timeout)
            except BaseException:
                self._runner.stop()
                self._close_own_cluster()
                raise

    @property
    def asynchronous(self) -> bool:
        """Whether calls return awaitables: always for an asynchronous client; for a
        synchronous one when made on its own event loop (a coroutine run by
        ``client.sync``, a callback), as Dask's, where blocking would hang the loop."""
        if self._asynchronous:
            return True
        runner = self._runner
        return runner is not None and runner.in_loop_thread()

    @asynchronous.setter
    def asynchronous(self, value: bool) -> None:
        self._asynchronous = value

    # ---------------------------------------------------------------- lifecycle

    def __await__(self) -> Any:
        async def start() -> Client:
            if self.status == "newly-created":
                await self._start()
            return self

        return start().__await__()

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        address = self._address_arg
        if address is None:
            from shoal.deploy.local import LocalCluster

            self.cluster = await asyncio.to_thread(
                functools.partial(LocalCluster, **self._cluster_kwargs)
            )
            self._own_cluster = True
            address = self.cluster.scheduler_address
        elif not isinstance(address, str):
            self.cluster = address
            address = address.scheduler_address
        self.scheduler_address = address
        self.security = self._security_for(address)
        self._worker_conns.security = self.security
        hello = m.Hello(
            m.PROTOCOL_VERSION,
            "client",
            name=self.name,
            pid=os.getpid(),
            subscribe=self._subscribed,
        )
        self._conn, welcome = await connect(
            address, hello, timeout=self.timeout, security=self.security
        )
        self.id = welcome.assigned
        self.dashboard_port = welcome.dashboard_port  # 0: the scheduler serves no dashboard
        self._conn.on_close = self._scheduler_lost
        self._conn.set_handler(self._on_frame)
        if not self._asynchronous:
            self._conn.enable_direct_writes()  # for the calling threads (_send)
        if not self.forward_output:
            self._conn.send(m.ForwardOutput(False))
        self._heartbeats = asyncio.ensure_future(
            keep_alive(self._conn, m.Heartbeat, self.scheduler_timeout, interval=2.0)
        )
        self.status = "running"
        _live_clients.add(self)
        if self._subscribed:
            await self._info(0, 0)  # a fresh summary, for the repr (pushes may be older)
        if self._set_as_default and not self._asynchronous:
            # Dask calls its scheduler synchronously: an asynchronous client's get
            # returns an awaitable, so it is never made the default.
            collections.set_default(self)

    def _security_for(self, address: str) -> Security:
        if self.security is not None:
            return self.security
        if getattr(self.cluster, "security", None) is not None:
            return self.cluster.security
        from shoal.deploy.local import security_of_local_cluster

        return security_of_local_cluster(address) or Security.from_env()

    def close(self) -> Any:
        """Release every key this client holds and disconnect."""
        if self.asynchronous:
            return self._close_async()
        if self._closed:
            return None
        assert self._runner is not None
        try:
            self._runner.run_sync(self._close_async(), self.timeout)
        finally:
            self._runner.stop()
            if self._callback_pool is not None:
                self._callback_pool.shutdown(wait=False)
            self._close_own_cluster()
        return None

    async def _close_async(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.graph_data.clear()  # released while the connection still sends
        self.status = "closed"
        _live_clients.discard(self)
        if self._heartbeats is not None:
            self._heartbeats.cancel()
        collections.unset_default(self)
        # A cancelled future's callbacks may drop the last reference to another future,
        # whose release edits ``_states``: iterate over a copy.
        for st in list(self._states.values()):
            st.cancel("the client closed")
        self._progress_lost()
        self._flush_outbox()
        conn = self._conn
        if conn is not None and not conn.closed:
            held = list(self._states)
            if held:
                conn.send(m.ReleaseKeys(held, stimulus_id=f"client-close-{self.id}"))
            conn.close()
        self._worker_conns.close()
        self._lanes.close()
        if self._asynchronous:
            if self._callback_pool is not None:
                self._callback_pool.shutdown(wait=False)
            if self._own_cluster:
                await in_thread(self._close_own_cluster)  # at exit too

    def _abandon(self) -> None:
        """At exit, an asynchronous client still open: its loop may be gone, so only
        mark it closed (its connection dies with the process; nothing to report)."""
        self._closed = True
        self.status = "closed"

    def _close_own_cluster(self) -> None:
        if self._own_cluster and self.cluster is not None:
            self.cluster.close()
            self._own_cluster = False

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> Client:
        return await self

    async def __aexit__(self, *exc: Any) -> None:
        await self._close_async()

    def _scheduler_lost(self, conn: Connection, exc: BaseException | None) -> None:
        if self.status == "closed":
            return
        self.status = "closed"  # close() still has threads and connections to clean up
        reason = f"lost the scheduler: {conn.close_reason}"
        logger.warning(reason)
        for st in list(self._states.values()):
            if not st.done():
                st.cancel(reason)
        self._progress_lost()

    # ---------------------------------------------------------------- threads and the loop

    def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        assert self._runner is not None
        return self._runner.run_sync(coro, timeout)

    def _call_in_loop(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        assert loop is not None
        if self._runner is None or self._runner.in_loop_thread():
            fn()
        else:
            loop.call_soon_threadsafe(fn)

    def _send(self, msg: m.Message) -> None:
        """Queue a message for the scheduler from any thread, keeping order. From a
        thread other than the loop's, a small submission is written on the connection at
        once when nothing waits before it (no loop wake-up)."""
        runner = self._runner
        direct = runner is not None and _may_write_direct(msg) and not runner.in_loop_thread()
        with self._outbox_lock:
            if direct and not self._outbox and not self._wakeup_scheduled:
                conn = self._conn
                if conn is not None and conn.write_direct([msg]):
                    return
            self._outbox.append(msg)
            if self._wakeup_scheduled:
                return
            self._wakeup_scheduled = True
        loop = self._loop
        assert loop is not None
        if runner is None or runner.in_loop_thread():
            loop.call_soon(self._flush_outbox)
        else:
            loop.call_soon_threadsafe(self._flush_outbox)

    def _flush_outbox(self) -> None:
        # Under the lock until written: a direct write (_send) must not overtake the
        # messages taken from the outbox.
        with self._outbox_lock:
            self._wakeup_scheduled = False
            msgs = list(self._outbox)
            self._outbox.clear()
            conn = self._conn
            if conn is None or conn.closed:
                return
            released: list[Key] = []
            for msg in msgs:
                if type(msg) is m.ReleaseKeys:  # merge runs of releases into one message
                    released.extend(msg.keys)
                    continue
                if released:
                    conn.send(m.ReleaseKeys(released, stimulus_id=f"release-{self.id}"))
                    released = []
                conn.send(msg)
            if released:
                conn.send(m.ReleaseKeys(released, stimulus_id=f"release-{self.id}"))
            conn.flush()  # now, not one more loop iteration later

    def _run_callback(self, fn: Callable[[Future], Any], future: Future) -> None:
        if self._callback_pool is None:
            self._callback_pool = ThreadPoolExecutor(1, thread_name_prefix="shoal-callback")

        def call() -> None:
            try:
                fn(future)
            except Exception:
                logger.exception("error in done-callback %r of %r", fn, future)

        self._callback_pool.submit(call)

    # ---------------------------------------------------------------- references

    def _hold(self, key: Key, state: FutureState | None) -> FutureState:
        with self._refs_lock:
            self._refs[key] = self._refs.get(key, 0) + 1
            st = self._states.get(key)
            if st is None or (st.status == "cancelled" and state is None):
                # A cancelled key submitted again starts afresh; futures of the old
                # submission keep their cancelled state.
                st = self._states[key] = state or FutureState(key, self._cancels)
            return st

    def _release(self, key: Key) -> None:
        with self._refs_lock:
            n = self._refs.get(key, 0) - 1
            if n > 0:
                self._refs[key] = n
                return
            self._refs.pop(key, None)
            st = self._states.pop(key, None)
            if st is not None and st.inline is not None:
                self._inline_held -= len(st.inline.data)
        if self.status == "running":
            self._send(m.ReleaseKeys([key]))

    def _keep_inline(self, st: FutureState, value: m.Payload | None) -> m.Payload | None:
        """The inline value to keep for ``st`` (replacing its old one): None past
        INLINE_HELD_MAX bytes held in all, the value is then fetched from its holder."""
        with self._refs_lock:  # (_release counts it out under the same lock)
            if self._states.get(st.key) is not st:
                return None  # released just now: nothing to keep
            old = st.inline
            held = self._inline_held - (len(old.data) if old is not None else 0)
            if value is not None and held + len(value.data) > INLINE_HELD_MAX:
                value = None
            self._inline_held = held + (len(value.data) if value is not None else 0)
            st.inline = value
            return value

    # ---------------------------------------------------------------- messages in

    def _on_frame(self, conn: Connection, frame: Frame) -> None:
        states = self._states
        for msg in frame.messages:
            t = type(msg)
            if t is m.KeyInMemory:
                st = states.get(msg.key)  # type: ignore[attr-defined]
                if st is not None:  # (an inline value is loaded by whoever gathers it)
                    value = self._keep_inline(st, msg.value)  # type: ignore[attr-defined]
                    st.finish(value, msg.type_name, msg.who_has)  # type: ignore[attr-defined]
            elif t is m.KeyErred:
                st = states.get(msg.key)  # type: ignore[attr-defined]
                if st is not None:
                    st.set_error(*_remote_exception(msg))  # type: ignore[arg-type]
            elif t is m.ClusterState:
                self._pushed_summary(msg)  # type: ignore[arg-type]
            elif t is m.ProgressCounts:
                self._progress_counts(msg)  # type: ignore[arg-type]
            elif t is m.KeyCancelled:
                st = states.get(msg.key)  # type: ignore[attr-defined]
                if st is not None:
                    # The answer to one of our cancels is about the futures of that time,
                    # not those of a key submitted again since.
                    n = _cancel_number(msg.stimulus_id)  # type: ignore[attr-defined]
                    if n is None or st.born < n:
                        st.cancel(msg.reason)  # type: ignore[attr-defined]
            elif t is m.TaskOutput:
                self._output.received(msg)  # type: ignore[arg-type]
            elif t is m.LaneClosed:
                self._lanes.closed(msg)  # type: ignore[arg-type]
            elif t is m.TaskUnplaceable:  # once per episode (the scheduler's count)
                logger.warning("%s", msg.reason)  # type: ignore[attr-defined]
            elif t in _LATE_REPLIES:
                pass  # the answer to a request we stopped waiting for
            elif t is m.Refused:  # the scheduler is closing this connection: say why
                raise ProtocolError(f"the scheduler refused a message: {msg.reason}")  # type: ignore[attr-defined]
            else:
                raise ProtocolError(f"the scheduler may not send {t.__name__} to a client")


def _may_write_direct(msg: m.Message) -> bool:
    """Whether ``msg`` is a small submission, worth writing from the caller's thread (a
    large one is written by the loop, part after part). Releases go through the loop:
    written from the caller, at the end of a compute, they cost it more (measured)."""
    return type(msg) is m.SubmitTasks and len(msg.tasks) <= DIRECT_SUBMIT_TASKS


def _cancel_number(stimulus_id: str) -> int | None:
    """Which of this client's cancel calls a scheduler notice answers, if any."""
    if not stimulus_id.startswith("cancel-"):
        return None
    number = stimulus_id.split("-", 2)[1]
    return int(number) if number.isdigit() else None


def _future_key(f: Future) -> Key:
    return f.key


def _remote_exception(msg: m.KeyErred) -> tuple[BaseException, str]:
    return remote_exception(msg.exception, msg.traceback), msg.traceback


def remote_exception(payload: m.Payload, traceback: str) -> BaseException:
    """A task's exception as the caller sees it: loaded, its remote traceback a note."""
    try:
        exc = loads_value(payload)
    except Exception as e:  # the exception's class is not importable here
        exc = RuntimeError(f"a task failed with an exception that cannot be loaded here: {e}")
    if not isinstance(exc, BaseException):
        exc = RuntimeError(repr(exc))
    if traceback and hasattr(exc, "add_note"):
        exc.add_note(f"Remote traceback (most recent call last):\n{traceback.rstrip()}")
    return exc


__all__ = ["Client", "CommClosedError", "SerializationError"]
