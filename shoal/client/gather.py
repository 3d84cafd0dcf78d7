"""Getting data to and from workers from the client's side: ``gather`` (results of
futures, fetched from the workers that hold them, asking the scheduler again for
data lost with a worker) and ``scatter`` (local data placed on workers). A mixin of
:class:`~shoal.client.client.Client`, whose connections and loop it uses."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import uuid
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from shoal.client.futures import Future, FutureState, wait_states
from shoal.client.output import OutputReceiver
from shoal.comm.connection import Connection, PeerProtocolError
from shoal.comm.pool import ConnectionPool
from shoal.comm.same_host import fetch_data
from shoal.protocol import messages as m
from shoal.protocol.messages import Key, check_key
from shoal.protocol.serialize import SerializationError, dumps_value, loads_value, loads_values

if TYPE_CHECKING:
    from shoal.client.client import Client

logger = logging.getLogger("shoal.client")
T = TypeVar("T")


class GatherMixin:
    asynchronous: bool
    _conn: Connection | None
    _worker_conns: ConnectionPool
    _states: dict[Key, FutureState]
    _output: OutputReceiver
    _scatter_rr: Iterator[int]

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

        def _send(self, msg: m.Message) -> None: ...

        def _flush_outbox(self) -> None: ...

        async def _info(self, start: int = 0, limit: int = -1) -> m.InfoReply: ...

    def gather(self, futures: Any, errors: str = "raise") -> Any:
        """The results of (a structure of lists, tuples and dicts of) futures."""
        found: list[Future] = []
        _collect(futures, found)
        if not self.asynchronous:
            # From a plain thread: wait on the futures' own events and take inline values
            # here; the loop only when something must be fetched (or raised).
            by_key = _inline_values(found)
            if by_key is not None:
                self._output.reraise([f.key for f in found], self._states)
                return _rebuild(futures, by_key)
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
                    inline = st.inline
                    if inline is None:
                        need.append(st)
                        continue
                    try:
                        values[f.key] = loads_value(inline)  # a fresh object each gather
                    except Exception as e:  # for good, as a fetched value that does not load
                        e.add_note(f"raised loading the inline result of {f.key!r}")
                        st.set_error(e, "")
                        if errors == "raise":
                            raise
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
        # Holders named by the completion notice need no WhoHas (a stale one answers
        # "missing", and the key is asked for again, as one with no holder).
        who_has = {st.key: st.who_has for st in states if st.who_has}
        ask = list({st.key: None for st in states if st.key not in who_has})
        if ask:
            reply, _ = await self._conn.request(lambda rid: m.WhoHasRequest(rid, ask))
            assert isinstance(reply, m.WhoHasReply)
            who_has.update(reply.who_has)
        by_worker: dict[str, list[Key]] = {}
        lost_keys = set()
        for key, workers in who_has.items():
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
        reply, buffers = await fetch_data(conn, keys)
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
            futures[key] = Future(key, cast("Client", self))
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


def _inline_values(futures: list[Future]) -> dict[Key, Any] | None:
    """Values by key when every future finished with an inline value (waiting for
    each), freshly loaded; None as soon as one did not (erred, cancelled, or fetched)."""
    values: dict[Key, Any] = {}
    for f in futures:
        st = f._state
        st.wait_sync(None)
        found, value = st.inline_value()
        if not found:
            return None
        values[f.key] = value
    return values


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
