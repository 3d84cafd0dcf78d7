"""A stand-in for the client in tests of ``submit_graph``: it keeps the task specs it
is given instead of sending them."""

from __future__ import annotations

from typing import Any

from shoal.client.futures import Future
from shoal.client.graph.dask_graph import GraphEncoder
from shoal.client.graph.order_cache import OrderCache
from shoal.protocol.serialize import FunctionTable


class SpecsClient:
    """What ``submit_graph`` needs of a client; keeps the specs it is given."""

    def __init__(self) -> None:
        self._states: dict = {}
        self.specs: list = []
        self.functions = FunctionTable()
        self._encoder = GraphEncoder(self.functions, {Future: lambda f: f.key})
        self._orders = OrderCache()

    def _graph_encoder(self) -> GraphEncoder:
        return self._encoder

    def _submit_parts(self, parts: Any, keys: list) -> list:
        for part in parts:
            self.specs.extend(part)
        return [None] * len(keys)
