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
import hashlib
import itertools
import logging
import os
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shoal.client import collections
from shoal.client.actors import check_actor_class, make_actor_futures
from shoal.client.cluster_info import ClusterInfo
from shoal.client.construction import (
    ConstructionMixin,
    address_from_scheduler_file,
    check_cluster_kwargs,
)
from shoal.client.dask_graph import GraphEncoder
from shoal.client.data_location import DataLocationMixin
from shoal.client.datasets import DatasetsMixin
from shoal.client.futures import Future, FutureState, wait_states
from shoal.client.loop import LoopRunner, in_thread
from shoal.client.output import OutputReceiver
from shoal.client.pins import PinsMixin
from shoal.client.plugins import PluginsMixin
from shoal.client.remote import RemoteMixin
from shoal.client.restart import RestartMixin
from shoal.client.restrictions import duration_hint, task_restrictions
from shoal.client.task_stream import TaskStreamMixin
from shoal.comm.connection import CommClosedError, Connection, PeerProtocolError
from shoal.comm.heartbeat import keep_alive
from shoal.comm.pool import ConnectionPool
from shoal.comm.security import Security
from shoal.comm.tcp import connect
from shoal.config import CONFIGURED, resolve
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame, ProtocolError
from shoal.protocol.messages import Key, check_key
from shoal.protocol.serialize import (
    FunctionTable,
    SerializationError,
    dumps_task_args,
    dumps_value,
    loads_value,
    loads_values,
)

logger = logging.getLogger("shoal.client")
_LATE_REPLIES = (
    *(m.HeartbeatReply, m.RetireReply, m.WhoHasReply, m.InfoReply, m.GroupsReply),
    *(m.PinReply, m.EventsReply, m.PluginReply, m.RunReply, m.DatasetReply),
    m.TaskStreamReply,
    *(m.RebalanceReply, m.HasWhatReply),
)
T = TypeVar("T")
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
    RemoteMixin,
    RestartMixin,
    PinsMixin,
    PluginsMixin,
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
        """Queue a message for the scheduler from any thread, keeping order."""
        with self._outbox_lock:
            self._outbox.append(msg)
            if self._wakeup_scheduled:
                return
            self._wakeup_scheduled = True
        loop = self._loop
        assert loop is not None
        if self._runner is None or self._runner.in_loop_thread():
            loop.call_soon(self._flush_outbox)
        else:
            loop.call_soon_threadsafe(self._flush_outbox)

    def _flush_outbox(self) -> None:
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
            self._states.pop(key, None)
        if self.status == "running":
            self._send(m.ReleaseKeys([key]))

    # ---------------------------------------------------------------- messages in

    def _on_frame(self, conn: Connection, frame: Frame) -> None:
        states = self._states
        for msg in frame.messages:
            t = type(msg)
            if t is m.KeyInMemory:
                st = states.get(msg.key)  # type: ignore[attr-defined]
                if st is not None:
                    if msg.value is not None:  # type: ignore[attr-defined]
                        st.finish(loads_value(msg.value), True, msg.type_name)  # type: ignore[attr-defined]
                    else:
                        st.finish(type_name=msg.type_name)  # type: ignore[attr-defined]
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
            elif t is m.TaskUnplaceable:  # once per episode (the scheduler's count)
                logger.warning("%s", msg.reason)  # type: ignore[attr-defined]
            elif t in _LATE_REPLIES:
                pass  # the answer to a request we stopped waiting for
            elif t is m.Refused:  # the scheduler is closing this connection: say why
                raise ProtocolError(f"the scheduler refused a message: {msg.reason}")  # type: ignore[attr-defined]
            else:
                raise ProtocolError(f"the scheduler may not send {t.__name__} to a client")

    # ---------------------------------------------------------------- submitting

    def submit(
        self,
        func: Callable[..., Any],
        *args: Any,
        key: Key | None = None,
        pure: bool = True,
        retries: int = 0,
        priority: int = 0,
        workers: Any = None,
        resources: Any = None,
        allow_other_workers: bool = False,
        duration: Any = None,
        actor: bool = False,
        **kwargs: Any,
    ) -> Future:
        """Run ``func(*args, **kwargs)`` on a worker; futures among the arguments are
        replaced by their results. ``pure=True`` names the task by its inputs, so the
        same call twice gives the same key.

        ``workers``: a worker address, name or host, or a list of them: the task runs
        only there (it waits if none is connected), or preferably there with
        ``allow_other_workers=True``. ``resources``: e.g. ``{"GPU": 1}``, held on the
        worker while the task runs; only workers that declared enough run it, never
        more such tasks at once than they have. ``duration``: how long it is expected
        to run (``"4h"``, ``"30s"``, seconds): not started on a worker whose remaining
        lifetime is shorter (``shoal worker --lifetime``). ``actor=True``: ``func`` is a
        class whose instance stays on its worker (see ``shoal/client/actors.py``)."""
        restrictions = task_restrictions(workers, allow_other_workers, resources)
        hint = duration_hint(duration)
        if not callable(func):
            raise TypeError(f"submit needs a callable, got {type(func).__name__}")
        if actor:
            check_actor_class(func)
        pure = pure and not actor  # each actor is a new instance
        spec = self._task_spec(
            func, args, kwargs, key, pure, retries, priority, group="", restrictions=restrictions
        )
        spec.duration = hint
        futures = self._submit([spec], [spec.key])
        return make_actor_futures(self, futures, func)[0] if actor else futures[0]

    def map(
        self,
        func: Callable[..., Any],
        *iterables: Iterable[Any],
        key: str | list[Key] | None = None,
        pure: bool = True,
        retries: int = 0,
        priority: int = 0,
        workers: Any = None,
        resources: Any = None,
        allow_other_workers: bool = False,
        duration: Any = None,
        actor: bool = False,
        **kwargs: Any,
    ) -> list[Future]:
        """``submit`` for each element of the iterables, in one message. ``key``: a
        prefix for the keys, or the keys themselves (then, as in Dask, each key's name
        is its group: ``("x-1", 0)`` is in group ``"x-1"``); else one group per call."""
        restrictions = task_restrictions(workers, allow_other_workers, resources)
        hint = duration_hint(duration)
        if not callable(func):
            raise TypeError(f"map needs a callable, got {type(func).__name__}")
        arglists = list(zip(*iterables))
        if actor:
            check_actor_class(func)
        pure = pure and not actor
        name = key if isinstance(key, str) else _funcname(func)
        keys = key if isinstance(key, list) else None
        if keys is not None and len(keys) != len(arglists):
            raise ValueError(f"map got {len(keys)} keys for {len(arglists)} tasks")
        group = f"{name}-{uuid.uuid4().hex[:8]}"
        specs = [
            self._task_spec(
                func,
                args,
                kwargs,
                keys[i] if keys else None,
                pure,
                retries,
                priority,
                group=group if keys is None else "",  # explicit keys name their groups
                name=name,
                restrictions=restrictions,
            )
            for i, args in enumerate(arglists)
        ]
        if hint is not None:
            for spec in specs:
                spec.duration = hint
        futures = self._submit(specs, [s.key for s in specs])
        return list(make_actor_futures(self, futures, func)) if actor else futures

    def _task_spec(
        self,
        func: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        key: Key | None,
        pure: bool,
        retries: int,
        priority: int,
        group: str,
        name: str | None = None,
        restrictions: m.TaskRestrictions | None = None,
    ) -> m.TaskSpec:
        # A partial is taken apart: its function goes to the table once, its bound
        # arguments travel with the task (a partial per task must not mean a
        # function-table entry per task).
        while isinstance(func, functools.partial):
            args = func.args + tuple(args)
            kwargs = {**func.keywords, **kwargs}
            func = func.func
        fid = self._functions.register(func)
        payload, deps, funcs = dumps_task_args(args, kwargs, self._ref_types, self._functions)
        if key is not None:
            check_key(key)
        else:
            prefix = name or _funcname(func)
            if pure:
                h = hashlib.blake2b(payload.data, digest_size=12, key=fid.encode()[:64])
                key = f"{prefix}-{h.hexdigest()}"
            else:
                key = f"{prefix}-{uuid.uuid4().hex}"
        return m.TaskSpec(
            key,
            fid,
            payload,
            deps,
            group=group,
            priority=priority,
            retries=retries,
            funcs=funcs,
            restrictions=restrictions,
        )

    def _submit(self, specs: list[m.TaskSpec], keys: list[Key]) -> list[Future]:
        return self._submit_parts(iter((specs,)), keys)

    def _submit_parts(self, parts: Iterator[list[m.TaskSpec]], keys: list[Key]) -> list[Future]:
        """Futures for ``keys``; the task specs go to the scheduler part by part as
        ``parts`` makes them (dependencies in earlier parts). The scheduler starts on
        them when the last part arrives; if making a part fails, the graph is dropped."""
        if self.status != "running":
            raise RuntimeError(f"the client is {self.status}")
        futures = [Future(k, self) for k in keys]  # held before the message can be answered
        wanted = list(dict.fromkeys(keys))
        seen: set[Key] = set()
        # Under one lock: the message that first uses a function must carry its bytes,
        # and must not be overtaken by another thread's message using it; and the parts
        # of one graph must not be interleaved with another submission.
        with self._submit_lock:
            sid = f"submit-{next(self._submits)}"
            sent = False
            try:
                part = next(parts)
                for following in itertools.chain(parts, (None,)):
                    unique = []
                    for spec in part:
                        if spec.key not in seen:
                            seen.add(spec.key)
                            unique.append(spec)
                    last = following is None
                    functions = self._new_functions()
                    self._send(
                        m.SubmitTasks(unique, [] if not last else wanted, functions, sid, not last)
                    )
                    sent = True
                    part = following  # type: ignore[assignment]
            except BaseException:
                if sent:
                    self._send(m.SubmitTasks([], [], {}, sid))  # wants nothing: dropped
                raise
        return futures

    def _new_functions(self) -> dict[str, bytes]:
        """Function-table entries not yet sent on this connection (under the lock)."""
        table = self._functions.bytes
        if len(table) == len(self._sent_functions):
            return {}
        functions = {fid: table[fid] for fid in table.keys() - self._sent_functions}
        self._sent_functions.update(functions)
        return functions

    # ---------------------------------------------------------------- dask collections

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """Dask's scheduler protocol: the values of ``keys`` (a key or nested lists of
        keys) of the graph ``dsk``. ``dask.config.set(scheduler=client.get)`` works."""
        return collections.get(self, dsk, keys, **kwargs)

    def compute(self, collections_: Any, sync: bool = False, **kwargs: Any) -> Any:
        """A future for each Dask collection (a list for a list), or the values with
        ``sync=True``. Takes ``optimize_graph``, ``priority``, ``retries``, ``workers``,
        ``resources``, ``allow_other_workers``, ``traverse``."""
        return collections.compute(self, collections_, sync=sync, **kwargs)

    def persist(self, collections_: Any, **kwargs: Any) -> Any:
        """Start computing Dask collections and return them backed by futures, at once."""
        return collections.persist(self, collections_, **kwargs)

    def _graph_encoder(self) -> GraphEncoder:
        if self._encoder is None:
            self._encoder = GraphEncoder(self._functions, self._ref_types)
        return self._encoder

    def cancel(self, futures: Iterable[Future] | Future, force: bool = False) -> Any:
        """Cancel futures (and, for this client, everything built on them).

        A task that nothing else needs is released at once; if it is running, its
        worker's thread stays counted busy until it really returns, so nothing waits
        behind it. With ``force``, a task still running is interrupted: a
        :class:`~shoal.TaskInterrupted` exception is raised in its thread (only while
        that thread runs Python code: not inside ``time.sleep``, a lock, I/O or C code),
        and if it has not returned after the worker's grace period (5 s,
        ``shoal worker --interrupt-grace``) the worker restarts through its nanny, its
        results handed off, nothing counted as a failure."""
        fs = [futures] if isinstance(futures, Future) else list(futures)
        keys = [f.key for f in fs]
        states = [f._state for f in fs]

        def mark() -> None:
            for st in states:
                st.cancel("cancelled")

        with self._refs_lock:
            self._cancels += 1
            stimulus_id = f"cancel-{self._cancels}-{uuid.uuid4().hex[:8]}"
        msg = m.CancelKeys(keys, stimulus_id=stimulus_id, force=force)

        async def cancel() -> None:
            mark()
            self._send(msg)

        if self._asynchronous:
            return cancel()
        if self._runner is not None and self._runner.in_loop_thread():
            mark()
            self._send(msg)
            return None
        return self._sync(cancel())

    def get_executor(self, **kwargs: Any) -> Any:
        """A ``concurrent.futures.Executor`` running on this client's cluster;
        ``kwargs`` go to every ``submit`` (e.g. ``workers``, ``retries``)."""
        from shoal.client.executor import ClientExecutor

        return ClientExecutor(self, **kwargs)

    # ---------------------------------------------------------------- gathering

    def gather(self, futures: Any, errors: str = "raise") -> Any:
        """The results of (a structure of lists, tuples and dicts of) futures."""
        found: list[Future] = []
        _collect(futures, found)
        coro = self._gather_structure(futures, found, errors)
        if self.asynchronous:
            return coro
        result = self._sync(coro)
        self._output.reraise([f.key for f in found], self._states)  # the tasks' warnings
        return result

    async def _gather_structure(self, futures: Any, found: list[Future], errors: str) -> Any:
        by_key = await self._gather_values(found, errors=errors)
        if self.asynchronous:  # (on the caller's loop, in its task)
            self._output.reraise(list(by_key), self._states)
        return _rebuild(futures, by_key)

    async def _gather_async(self, futures: list[Future], timeout: float | None = None) -> list[Any]:
        values = await self._gather_values(futures, "raise", timeout)
        return [values[f.key] for f in futures]

    async def _gather_values(
        self, futures: list[Future], errors: str, timeout: float | None = None
    ) -> dict[Key, Any]:
        """Values by key; with ``errors="skip"`` failed futures are left out."""
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', not {errors!r}")
        values: dict[Key, Any] = {}
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await self._gather_loop(futures, errors, values)
        except TimeoutError:
            if not deadline.expired():
                raise  # e.g. a task's own TimeoutError
            done = sum(f.key in values for f in futures)
            keys = ", ".join(repr(f.key) for f in futures[:3])
            keys += ", ..." if len(futures) > 3 else ""
            raise TimeoutError(
                f"gathering {len(futures)} results ({keys}) did not finish within {timeout}s "
                f"({done} received)"
            ) from None

    async def _gather_loop(
        self, futures: list[Future], errors: str, values: dict[Key, Any]
    ) -> dict[Key, Any]:
        while True:
            await wait_states([f._state for f in futures])
            for f in futures:
                st = f._state
                if st.status == "cancelled" or (st.status == "error" and errors == "raise"):
                    assert st.exception is not None
                    raise st.exception.with_traceback(None)
            need = []
            for f in futures:
                st = f._state
                if st.status == "finished" and f.key not in values:
                    if st.has_value:
                        values[f.key] = st.value
                    else:
                        need.append(st)
            lost = await self._fetch(need, values)
            for st in need:
                if st.status == "error" and errors == "raise":
                    assert st.exception is not None
                    raise st.exception.with_traceback(None)
            if not lost:
                return values
            # The data went with a worker. The scheduler recomputes it; its notice
            # may have come already, so ask it to say again where each key stands.
            for st in lost:
                st.reset()
            self._send(m.WantKeys([st.key for st in lost], f"lost-{uuid.uuid4().hex[:8]}"))

    async def _fetch(self, states: list[FutureState], values: dict[Key, Any]) -> list[FutureState]:
        """Fetch from workers; return the states whose data no worker holds now."""
        if not states:
            return []
        assert self._conn is not None
        keys = list({st.key: None for st in states})
        reply, _ = await self._conn.request(lambda rid: m.WhoHasRequest(rid, keys))
        assert isinstance(reply, m.WhoHasReply)
        by_worker: dict[str, list[Key]] = {}
        lost_keys = set()
        for key, workers in reply.who_has:
            if workers:
                by_worker.setdefault(workers[hash(key) % len(workers)], []).append(key)
            else:
                lost_keys.add(key)
        results = await asyncio.gather(
            *(self._get_from_worker(w, ks) for w, ks in by_worker.items()), return_exceptions=True
        )
        for (worker, ks), res in zip(by_worker.items(), results):
            if isinstance(res, BaseException):
                if _connection_failure(res):
                    logger.info("could not fetch %d keys from %s: %s", len(ks), worker, res)
                    lost_keys.update(ks)  # ask again: the scheduler will know more by then
                    await asyncio.sleep(0.05)
                    continue
                # The reply came but cannot be used (it broke the protocol, or does not
                # load here): asking again would fail the same way.
                failed_keys = set(ks)
                for st in states:
                    if st.key in failed_keys and st.status == "finished":
                        err = SerializationError(
                            f"the result of {st.key!r} could not be received from {worker}: "
                            f"{type(res).__name__}: {res}"
                        )
                        err.__cause__ = res
                        st.set_error(err, "")
                continue
            got, missing, failed, unloadable = res
            values.update(got)
            lost_keys.update(missing)
            errors: dict[Key, BaseException] = dict(unloadable)
            for key, reason in failed:
                errors[key] = SerializationError(f"the result of {key!r}: {reason}")
            for key, exc in errors.items():  # for good: asking again would fail again
                if key in unloadable:
                    exc.add_note(f"raised loading the result of {key!r} from {worker}")
                for st in states:
                    if st.key == key:
                        st.set_error(exc, "")
        return [st for st in states if st.key in lost_keys and st.key not in values]

    async def _get_from_worker(
        self, address: str, keys: list[Key]
    ) -> tuple[dict[Key, Any], list[Key], list[tuple[Key, str]], dict[Key, Exception]]:
        """Values by key, keys the worker does not hold, keys it cannot pickle (why),
        and keys whose value cannot be unpickled here (the exception)."""
        conn = await self._worker_conns.get(address)
        reply, buffers = await conn.request(lambda rid: m.GetData(rid, keys))
        assert isinstance(reply, m.DataReply)
        got, unloadable = loads_values(reply.keys, reply.payloads, buffers)
        return got, list(reply.missing), list(reply.failed), unloadable

    # ---------------------------------------------------------------- scatter

    def scatter(self, data: Any, hash: bool = True, workers: list[str] | None = None) -> Any:
        """Place local data on workers (round robin over ``workers``, addresses or
        names, or over all); returns futures shaped like ``data`` (a list, a dict keyed
        by the desired keys, or a single future)."""
        coro = self._scatter_async(data, hash, workers)
        if self.asynchronous:
            return coro
        return self._sync(coro)

    async def _scatter_async(
        self, data: Any, hash_keys: bool, only: list[str] | None = None
    ) -> Any:
        encoded: dict[int, tuple[m.Payload, list[memoryview]]] = {}  # by id(value)
        if isinstance(data, dict):
            items = list(data.items())
            for key, _ in items:
                check_key(key)
        else:
            seq = data if isinstance(data, list | tuple | set | frozenset) else [data]
            items = []
            for value in seq:
                payload, buffers = encoded[id(value)] = dumps_value(value)
                if hash_keys:
                    h = hashlib.blake2b(payload.data, digest_size=12)
                    for b in buffers:
                        h.update(b)
                    token = h.hexdigest()
                else:
                    token = uuid.uuid4().hex
                items.append((f"{type(value).__name__}-{token}", value))
        infos = (await self._info()).workers
        wanted = set(only or ())
        workers = sorted(w.address for w in infos if not wanted or {w.address, w.name} & wanted)
        if not workers:
            raise RuntimeError(
                f"no workers to scatter to (asked for {only})"
                if only
                else "no workers to scatter to"
            )
        placement: dict[str, list[tuple[Key, Any]]] = {}
        for item in items:
            placement.setdefault(workers[next(self._scatter_rr) % len(workers)], []).append(item)
        futures: dict[Key, Future] = {}
        for key, _ in items:
            futures[key] = Future(key, self)
        assert self._conn is not None
        for worker, pairs in placement.items():
            conn = await self._worker_conns.get(worker)
            keys = [k for k, _ in pairs]
            payloads: list[m.Payload] = []
            out_buffers: list[memoryview] = []
            for _, value in pairs:
                payload, bufs = encoded.get(id(value)) or dumps_value(value)  # once each
                payloads.append(payload)
                out_buffers.extend(bufs)
            make = functools.partial(_update_data, keys=keys, payloads=payloads)
            reply, _ = await conn.request(make, out_buffers)
            assert isinstance(reply, m.Ack)
            self._flush_outbox()  # keep order: earlier messages before the scatter note
            self._conn.send(
                m.ScatterDone(keys, reply.nbytes, worker, f"scatter-{uuid.uuid4().hex[:8]}")
            )
        for f in futures.values():
            if not f.done():
                f._state.finish()
        if isinstance(data, dict):
            return {k: futures[k] for k, _ in items}
        if isinstance(data, list | tuple | set | frozenset):
            out = [futures[k] for k, _ in items]
            return type(data)(out) if isinstance(data, tuple) else out
        return futures[items[0][0]]


def _connection_failure(exc: BaseException) -> bool:
    """A failure to reach a worker or keep its connection (worth asking again, once the
    scheduler knows more), as opposed to a reply that cannot be used."""
    if isinstance(exc, PeerProtocolError):
        return False
    return isinstance(exc, OSError | TimeoutError | asyncio.CancelledError)


def _update_data(request_id: int, keys: list[Key], payloads: list[m.Payload]) -> m.Message:
    return m.UpdateData(request_id, keys, payloads)


def _cancel_number(stimulus_id: str) -> int | None:
    """Which of this client's cancel calls a scheduler notice answers, if any."""
    if not stimulus_id.startswith("cancel-"):
        return None
    number = stimulus_id.split("-", 2)[1]
    return int(number) if number.isdigit() else None


def _future_key(f: Future) -> Key:
    return f.key


def _funcname(func: Any) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    return "lambda" if name == "<lambda>" else str(name)


def _remote_exception(msg: m.KeyErred) -> tuple[BaseException, str]:
    try:
        exc = loads_value(msg.exception)
    except Exception as e:  # the exception's class is not importable here
        exc = RuntimeError(f"a task failed with an exception that cannot be loaded here: {e}")
    if not isinstance(exc, BaseException):
        exc = RuntimeError(repr(exc))
    if msg.traceback and hasattr(exc, "add_note"):
        exc.add_note(f"Remote traceback (most recent call last):\n{msg.traceback.rstrip()}")
    return exc, msg.traceback


def _collect(obj: Any, out: list[Future]) -> None:
    if isinstance(obj, Future):
        out.append(obj)
    elif isinstance(obj, list | tuple | set | frozenset):
        for x in obj:
            _collect(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _collect(x, out)


_SKIPPED = object()


def _rebuild(obj: Any, values: dict[Key, Any]) -> Any:
    """``obj`` with futures replaced by values; futures without one (skipped errors)
    are left out of their container."""
    if isinstance(obj, Future):
        return values.get(obj.key, _SKIPPED)
    if isinstance(obj, list | tuple | set | frozenset):
        items = [v for v in (_rebuild(x, values) for x in obj) if v is not _SKIPPED]
        return items if isinstance(obj, list) else type(obj)(items)
    if isinstance(obj, dict):
        out = {k: _rebuild(v, values) for k, v in obj.items()}
        return {k: v for k, v in out.items() if v is not _SKIPPED}
    return obj


__all__ = ["Client", "CommClosedError", "SerializationError"]
