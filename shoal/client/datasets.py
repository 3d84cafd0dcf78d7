"""Published datasets (``publish_dataset``/``get_dataset``/``list_datasets``/
``unpublish_dataset``, as Dask's) and ``fire_and_forget``. A mixin of
:class:`~shoal.client.client.Client`.

A dataset is any object (futures, a persisted Dask collection, a list of them...),
pickled here with its futures as references to their keys: the scheduler keeps those
keys alive under the dataset's name, and ``get_dataset`` in any client rebuilds the
object with futures of its own."""

from __future__ import annotations

import io
import pickle
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import cloudpickle

from shoal.client.futures import Future
from shoal.comm.connection import Connection
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

if TYPE_CHECKING:
    from shoal.client.client import Client

T = TypeVar("T")
_NO_DEFAULT = object()


class _DatasetPickler(cloudpickle.Pickler):
    def __init__(self, file: io.BytesIO):
        super().__init__(file)
        self.keys: list[Key] = []

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Future):
            self.keys.append(obj.key)
            return ("shoal-future", obj.key)
        return None


class _DatasetUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, client: Client):
        super().__init__(file)
        self.client = client

    def persistent_load(self, pid: Any) -> Any:
        kind, key = pid
        if kind != "shoal-future":
            raise pickle.UnpicklingError(f"unknown reference {kind!r} in a dataset")
        return Future(key, self.client)


class DatasetsMixin:
    asynchronous: bool
    _conn: Connection | None

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

        def _send(self, msg: m.Message) -> None: ...

        def _flush_outbox(self) -> None: ...

    async def _dataset_call(self, make: Any) -> m.DatasetReply:
        conn = self._conn
        if conn is None or conn.closed:
            raise RuntimeError("the client is closed")
        self._flush_outbox()  # our submissions first: a published key must be known
        reply, _ = await conn.request(make)
        assert isinstance(reply, m.DatasetReply)
        return reply

    def publish_dataset(
        self, *args: Any, name: str | None = None, override: bool = False, **kwargs: Any
    ) -> Any:
        """Keep objects on the scheduler under names, for any client to get, as Dask:
        ``publish_dataset(df=df)`` or ``publish_dataset(df, name="df")``. The futures
        in them stay computed while published (even after this client leaves).
        ValueError if a name is taken, unless ``override``."""
        if args:
            if name is None:
                raise TypeError("publish_dataset(*args) needs name=")
            if len(args) != 1:
                raise TypeError("publish_dataset takes one positional object (with name=)")
            kwargs[name] = args[0]
        if not kwargs:
            raise TypeError("publish_dataset needs an object to publish")
        encoded = []
        for ds_name, obj in kwargs.items():
            buf = io.BytesIO()
            pickler = _DatasetPickler(buf)
            pickler.dump(obj)
            encoded.append((ds_name, list(dict.fromkeys(pickler.keys)), buf.getvalue()))

        async def publish() -> None:
            for ds_name, keys, data in encoded:
                reply = await self._dataset_call(
                    lambda rid, n=ds_name, k=keys, d=data: m.PublishDataset(rid, n, k, d, override)
                )
                if reply.error:
                    raise ValueError(reply.error)

        return publish() if self.asynchronous else self._sync(publish())

    def get_dataset(self, name: str, default: Any = _NO_DEFAULT) -> Any:
        """The dataset published under ``name``, its futures now this client's;
        ``default`` if there is none (KeyError without a default)."""

        async def get() -> Any:
            reply = await self._dataset_call(lambda rid: m.DatasetRequest(rid, "get", name))
            if reply.error:
                if default is not _NO_DEFAULT:
                    return default
                raise KeyError(reply.error)
            obj = _DatasetUnpickler(io.BytesIO(reply.data), self).load()  # type: ignore[arg-type]
            if reply.keys:  # held here now: have the scheduler say where each stands
                self._send(m.WantKeys(list(reply.keys), f"get-dataset-{uuid.uuid4().hex[:8]}"))
            return obj

        return get() if self.asynchronous else self._sync(get())

    def list_datasets(self) -> Any:
        """The names of the published datasets, sorted."""

        async def names() -> list[str]:
            return list((await self._dataset_call(lambda rid: m.DatasetRequest(rid, "list"))).names)

        return names() if self.asynchronous else self._sync(names())

    def unpublish_dataset(self, name: str) -> Any:
        """Remove a dataset (its keys are released unless a client holds them);
        KeyError if there is none."""

        async def unpublish() -> None:
            reply = await self._dataset_call(lambda rid: m.DatasetRequest(rid, "unpublish", name))
            if reply.error:
                raise KeyError(reply.error)

        return unpublish() if self.asynchronous else self._sync(unpublish())


def fire_and_forget(obj: Any) -> None:
    """Run the futures in ``obj`` (a future, a collection of them, a persisted Dask
    collection) to completion even if every client releases them or leaves; the
    scheduler lets them go once done."""
    from shoal.client.progress import futures_of

    by_client: dict[int, tuple[Any, list[Key]]] = {}
    for f in futures_of(obj):
        by_client.setdefault(id(f.client), (f.client, []))[1].append(f.key)
    for client, keys in by_client.values():
        client._send(m.FireAndForget(keys, f"fire-and-forget-{uuid.uuid4().hex[:8]}"))
