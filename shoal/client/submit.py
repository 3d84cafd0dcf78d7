"""Submitting work from the client's side: ``submit``, ``map``, Dask collections
(``get``, ``compute``, ``persist``), ``cancel`` and ``get_executor``. A mixin of
:class:`~shoal.client.client.Client`, whose connection, function table and outbox
it uses."""

from __future__ import annotations

import functools
import hashlib
import itertools
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from shoal.client.actors import check_actor_class, make_actor_futures
from shoal.client.futures import Future
from shoal.client.graph import collections
from shoal.client.graph.dask_graph import GraphEncoder
from shoal.client.loop import LoopRunner
from shoal.client.restrictions import duration_hint, task_restrictions
from shoal.protocol import messages as m
from shoal.protocol.messages import Key, check_key
from shoal.protocol.serialize import FunctionTable, dumps_task_args

if TYPE_CHECKING:
    from shoal.client.client import Client
    from shoal.client.graph.order_cache import OrderCache

T = TypeVar("T")


class SubmitMixin:
    status: str
    _asynchronous: bool
    _runner: LoopRunner | None
    _functions: FunctionTable
    _sent_functions: set[str]
    _ref_types: dict[type, Callable[[Any], Key]]
    _encoder: GraphEncoder | None
    _orders: OrderCache
    _submit_lock: threading.Lock
    _submits: Iterator[int]
    _refs_lock: threading.Lock
    _cancels: int

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

        def _send(self, msg: m.Message) -> None: ...

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
        return make_actor_futures(cast("Client", self), futures, func)[0] if actor else futures[0]

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
        return list(make_actor_futures(cast("Client", self), futures, func)) if actor else futures

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
        client = cast("Client", self)
        futures = [Future(k, client) for k in keys]  # held before the message can be answered
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
                    if self.status != "running":
                        # The scheduler was lost (or the client closed) mid-graph: stop
                        # encoding the rest, which nobody would receive.
                        raise RuntimeError(
                            f"the client is {self.status}: the graph was not sent in full"
                        )
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
        return collections.get(cast("Client", self), dsk, keys, **kwargs)

    def compute(self, collections_: Any, sync: bool = False, **kwargs: Any) -> Any:
        """A future for each Dask collection (a list for a list), or the values with
        ``sync=True``. Takes ``optimize_graph``, ``priority``, ``retries``, ``workers``,
        ``resources``, ``allow_other_workers``, ``traverse``."""
        return collections.compute(cast("Client", self), collections_, sync=sync, **kwargs)

    def persist(self, collections_: Any, **kwargs: Any) -> Any:
        """Start computing Dask collections and return them backed by futures, at once."""
        return collections.persist(cast("Client", self), collections_, **kwargs)

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

        return ClientExecutor(cast("Client", self), **kwargs)


def _funcname(func: Any) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    return "lambda" if name == "<lambda>" else str(name)
