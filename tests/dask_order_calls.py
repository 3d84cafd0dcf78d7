"""Counting ``dask.order.order``'s calls in a test (shoal's client looks it up at each
call, so a patched attribute sees every ordering)."""

from __future__ import annotations

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
