"""Large constants of Dask graphs sent to the workers once, not inside every compute.

A ``from_pandas`` partition, a ``from_array`` array or a ``delayed(obj)`` is a Dask
``DataNode``: left in the graph it becomes an ``identity(value)`` task whose pickle
rides in ``SubmitTasks`` (client -> scheduler -> worker), again at every compute. Here
a top-level data node whose value is large (:func:`data_size` >= the config
``shoal.client.graph-data.min-bytes``) is instead scattered from the client straight to
a worker, under the graph's own key (round robin over the workers, as ``scatter``), and
the graph depends on that key like any held future. The scatter's ``ScatterDone`` goes
to the scheduler on the client's connection before the graph's ``SubmitTasks``, so the
scheduler knows the key when the graph arrives.

The futures are kept in a per-client LRU cache bounded by bytes (``shoal.client.
graph-data.cache-bytes``): a collection computed again ships nothing. Only keys that
are content tokens are cached (Dask's "same key, same value" contract: ``from_pandas``,
``from_array`` and ``delayed(obj)`` name their data ``<name>-<tokenize(value)>``); a
data node under any other key (a hand-written ``{"x": array}``) stays inline, as the
same key may hold another value next time. An entry is checked against the value's type
and size, and dropped (then sent again) when its future erred, was cancelled, or the
data was lost with its worker.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from shoal.client.futures import Future
from shoal.protocol.messages import Key

if TYPE_CHECKING:
    from shoal.client.client import Client

logger = logging.getLogger("shoal.client")

MIN_BYTES_KEY = "client.graph-data.min-bytes"
CACHE_BYTES_KEY = "client.graph-data.cache-bytes"

# ``tokenize`` is a 32-digit hex md5; Dask names data ``<name>-<token>`` (``frompandas-``,
# ``array-original-``, ``DataFrame-``), with a partition index for tuple keys.
_CONTENT_TOKEN = re.compile(r"(?:^|-)[0-9a-f]{32}$")


class Entry(NamedTuple):
    future: Future
    type_name: str
    nbytes: int


def content_keyed(key: Key) -> bool:
    """Whether Dask derived ``key`` from its value's content (``name-<token>`` or a
    tuple key whose name is one)."""
    name = key[0] if isinstance(key, tuple) and key else key
    return isinstance(name, str) and _CONTENT_TOKEN.search(name) is not None


def _bytes_setting(key: str) -> int:
    from dask.utils import parse_bytes

    from shoal import config

    value = config.get(key)
    try:
        n = parse_bytes(value) if isinstance(value, str) else value
    except ValueError:
        n = None
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(
            f"shoal.{key} must be a number of bytes >= 0 (e.g. '64KiB'), not {value!r}"
        )
    return n


class GraphDataCache:
    """Futures of graph data placed on the workers, by key; LRU, bounded by bytes."""

    def __init__(self, client: Client):
        self._client = client
        self._entries: OrderedDict[Key, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.sent = 0  # data nodes scattered so far (cache misses)
        self.reused = 0  # data nodes found in the cache

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def info(self) -> dict[str, Any]:
        """What the cache holds: keys with their type and size, total bytes, the limit,
        and counts of data nodes sent and reused."""
        with self._lock:
            keys = {k: {"type": e.type_name, "nbytes": e.nbytes} for k, e in self._entries.items()}
        return {
            "keys": keys,
            "nbytes": self.nbytes,
            "limit": _bytes_setting(CACHE_BYTES_KEY),
            "sent": self.sent,
            "reused": self.reused,
        }

    def clear(self) -> None:
        """Release every cached key (its data leaves the workers when nothing uses it)."""
        with self._lock:
            dropped = list(self._entries.values())
            self._entries.clear()
            self.nbytes = 0
        del dropped  # the futures go here, releasing their keys

    def drop(self, keys: list[Key]) -> None:
        with self._lock:
            for key in keys:
                entry = self._entries.pop(key, None)
                if entry is not None:
                    self.nbytes -= entry.nbytes

    def lookup(self, key: Key, type_name: str, nbytes: int) -> Future | None:
        """The cached future of ``key`` if it holds such a value and is still usable."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            usable = (
                entry.type_name == type_name
                and entry.nbytes == nbytes
                and entry.future.status == "finished"
            )
            if not usable:  # erred/lost/cancelled, or another value under the key: resend
                del self._entries[key]
                self.nbytes -= entry.nbytes
                return None
            self._entries.move_to_end(key)
            return entry.future

    def add(self, entries: Mapping[Key, Entry], pinned: set[Key]) -> None:
        """Cache ``entries``, then evict least recently used keys not in ``pinned``
        (those of the graph being submitted) until the cache fits its limit."""
        limit = _bytes_setting(CACHE_BYTES_KEY)
        evicted = []
        with self._lock:
            for key, entry in entries.items():
                old = self._entries.pop(key, None)
                if old is not None:
                    self.nbytes -= old.nbytes
                self._entries[key] = entry
                self.nbytes += entry.nbytes
            for key in list(self._entries):
                if self.nbytes <= limit:
                    break
                if key in pinned:
                    continue
                entry = self._entries.pop(key)
                self.nbytes -= entry.nbytes
                evicted.append(entry)
            # The graph's own data larger than the limit: not kept after this graph.
            for key in list(self._entries):
                if self.nbytes <= limit:
                    break
                entry = self._entries.pop(key)
                self.nbytes -= entry.nbytes
                evicted.append(entry)
        del evicted  # released here, outside the lock


def _large_data(dsk: Mapping[Key, Any]) -> Iterator[tuple[Key, Any, int]]:
    """The data nodes of ``dsk`` kept on the workers apart from the graph: content-keyed
    and at least ``min-bytes`` big, as ``(key, value, nbytes)``."""
    from dask._task_spec import DataNode

    min_bytes = -1  # looked up at the first data node: most graphs have none
    for key, node in dsk.items():
        if type(node) is not DataNode or not content_keyed(key):
            continue
        value = node.value
        nbytes = data_size(value)
        if min_bytes < 0:
            min_bytes = _bytes_setting(MIN_BYTES_KEY)
        if nbytes >= min_bytes:
            yield key, value, nbytes


def has_large_data(dsk: Mapping[Key, Any]) -> bool:
    """Whether ``dsk`` has a data node that :func:`place` would put on the workers."""
    return next(_large_data(dsk), None) is not None


def place(
    client: Client,
    dsk: Mapping[Key, Any],
    inline: Callable[[Key], bool],
) -> dict[Key, Future]:
    """Put the large, content-keyed data nodes of ``dsk`` (but those for which
    ``inline(key)``: e.g. tied to workers by annotations) on the workers, or find them
    there already; their futures by key, to be held until the graph is submitted. The
    caller leaves those keys out of the tasks it submits."""
    if client.asynchronous:
        # On the client's loop (an asynchronous client) a scatter cannot be waited
        # for here: the data stays inline in the graph.
        return {}
    cache = client.graph_data
    found: dict[Key, Future] = {}
    to_send: dict[Key, tuple[Any, str, int]] = {}
    for key, value, nbytes in _large_data(dsk):
        if inline(key):
            continue
        type_name = f"{type(value).__module__}.{type(value).__qualname__}"
        future = cache.lookup(key, type_name, nbytes)
        if future is not None:
            found[key] = future
        else:
            to_send[key] = (value, type_name, nbytes)
    cache.reused += len(found)
    if to_send:
        # A key some future of this client still holds (e.g. the erred data of a compute
        # that lost it) would be scattered into that old state: such keys stay inline.
        states = client._states
        to_send = {k: v for k, v in to_send.items() if k not in states}
    if to_send:
        try:
            futures = client.scatter({k: v[0] for k, v in to_send.items()})
        except (OSError, RuntimeError) as e:
            # No worker yet (RuntimeError: the graph waits for one, as it would with its
            # data inline), or one went away during the scatter (OSError): this time the
            # data stays in the graph.
            logger.debug("graph data stays inline: %s", e)
            return found
        cache.sent += len(to_send)
        new = {k: Entry(futures[k], v[1], v[2]) for k, v in to_send.items()}
        found.update(futures)
        cache.add(new, set(found))
    return found


def data_size(value: Any) -> int:
    """A data node's size: shoal's estimate for NumPy arrays and pandas objects (exact
    for numbers; Dask's ``sizeof`` of a pandas frame is a deep ``memory_usage``, 60-110
    µs each, for every partition at every compute: 6-11 ms of ``describe()`` on 100
    partitions), Dask's ``sizeof`` for anything else (it samples the items of a list or
    a dict, which shoal's estimate does not look into)."""
    if type(value).__module__.partition(".")[0] in ("pandas", "numpy"):
        from shoal.protocol.serialize import sizeof

        return sizeof(value)
    from dask.sizeof import sizeof as dask_sizeof

    return int(dask_sizeof(value))


def lost(client: Client, placed: Mapping[Key, Future]) -> list[Key]:
    """Keys of ``placed`` whose data is gone (the future erred or was cancelled);
    dropped from the cache so that the next submission sends them again."""
    gone = [k for k, f in placed.items() if f.status in ("error", "cancelled")]
    if gone:
        client.graph_data.drop(gone)
    return gone
