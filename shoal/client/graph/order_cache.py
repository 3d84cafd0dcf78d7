"""``dask.order``'s order for a graph this client ordered before, found by its structure.

A notebook cell run again submits the same graph: the same keys, dependencies and kinds
of nodes, but for the final step, which Dask names anew for every compute
(``...-finalize-hlgfinalizecompute-<token>``). Ordering it again is work done twice:
``dask.order`` costs 10-20 µs per task (0.3-0.4 ms of a 22-task array reduction of
~7 ms, 23 ms of ``describe()``'s 2,528 tasks).

A graph's *structure* is its keys in the graph's order, with its one output (the only
key nothing in the graph depends on) replaced by a placeholder, each key's
dependencies as positions, and the type of each node (``dask.order`` sets data and
alias nodes apart). ``dask.order`` does not look at the output's name: that node runs
last whatever it is called (``tests/client/test_order_cache.py`` checks this on random
graphs and on Dask's own ordering test graphs). Two graphs with equal structures get
the same order, as positions; so the order found for the first is the order
``dask.order`` gives the second. A graph with dependencies outside itself (futures it
uses) is not remembered.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from shoal.protocol.messages import Key

if TYPE_CHECKING:
    from shoal.client.graph.order import GraphIndex

MAX_TASKS = 50_000  # tasks of all the remembered structures together (their keys are held)


class _Output:
    """The placeholder for a graph's one output key in its structure."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<output>"


OUTPUT = _Output()


class OrderCache:
    """Orders of recently submitted graphs, by structure (one per client)."""

    def __init__(self, max_tasks: int = MAX_TASKS):
        self._orders: OrderedDict[Hashable, list[int]] = OrderedDict()
        self._held = 0  # tasks of the remembered structures
        self._max_tasks = max_tasks
        self._lock = threading.Lock()
        self.hits = 0

    def __len__(self) -> int:
        return len(self._orders)

    def structure(self, dsk: Mapping[Key, Any], index: GraphIndex) -> Hashable | None:
        """``dsk``'s structure (``index`` is its GraphIndex), or None for a graph not to
        remember: one too large, or with dependencies outside it."""
        keys = index.keys
        if index.outside or len(keys) > self._max_tasks:
            return None
        outputs = [i for i, dependents in enumerate(index.dependents) if not dependents]
        names: tuple[Any, ...] = tuple(keys)
        if len(outputs) == 1:
            (i,) = outputs
            names = (*names[:i], OUTPUT, *names[i + 1 :])
        kinds = tuple(map(type, dsk.values()))
        return (names, tuple(map(tuple, index.deps_of)), kinds)

    def get(self, structure: Hashable, keys: list[Key]) -> list[Key] | None:
        """The remembered order for ``structure``, as the keys of the graph now."""
        with self._lock:
            positions = self._orders.get(structure)
            if positions is None:
                return None
            self._orders.move_to_end(structure)
            self.hits += 1
        return [keys[i] for i in positions]

    def put(self, structure: Hashable, keys: list[Key], ordered: list[Key]) -> None:
        """Remember ``ordered`` (the graph's keys, ``keys`` in the graph's order)."""
        position = {key: i for i, key in enumerate(keys)}
        positions = [position[key] for key in ordered]
        with self._lock:
            if structure in self._orders:
                return
            self._orders[structure] = positions
            self._held += len(positions)
            while self._held > self._max_tasks:
                _, dropped = self._orders.popitem(last=False)
                self._held -= len(dropped)
