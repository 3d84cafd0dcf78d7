"""Helpers for tests of graph ordering: counting ``dask.order.order``'s calls (shoal's
client looks it up at each call, so a patched attribute sees every ordering), and a
graph with its output renamed (as Dask names a compute's final step anew)."""

from __future__ import annotations

import copy
from typing import Any

import dask.order
import pytest


def count_dask_order(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch ``dask.order.order`` for the test; the size of each graph it orders is
    appended to the list returned."""
    calls: list[int] = []
    real = dask.order.order

    def counting(dsk: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(dsk))
        return real(dsk, *args, **kwargs)

    monkeypatch.setattr(dask.order, "order", counting)
    return calls


def renamed(dsk: dict[Any, Any], old: Any, new: Any) -> dict[Any, Any]:
    """``dsk`` (Dask nodes) with the key ``old``, on which nothing depends, called
    ``new``, in the same place."""
    node = copy.copy(dsk[old])
    node.key = new
    return {(new if k == old else k): (node if k == old else v) for k, v in dsk.items()}
