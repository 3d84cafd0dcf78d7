"""Task functions of ``benchmarks/transfer.py`` (workers of both systems import them by
name; nothing here has side effects at import)."""

from __future__ import annotations

import os
from typing import Any


def make_payload(kind: str, nbytes: int) -> Any:
    """A value of about ``nbytes`` bytes, every page touched: a float64 numpy array, a
    pandas frame of four float64 columns (one block), or a bytes."""
    if kind == "bytes":
        return b"x" * nbytes
    import numpy as np

    if kind == "numpy":
        return np.full(nbytes // 8, 1.5)
    if kind == "pandas":
        import pandas as pd

        rows = nbytes // 32
        return pd.DataFrame({c: np.full(rows, float(i)) for i, c in enumerate("abcd")})
    raise ValueError(f"unknown payload kind {kind!r}")


def payload_nbytes(value: Any) -> int:
    """The payload's size, computed where it arrived (a worker-to-worker transfer)."""
    if isinstance(value, bytes):
        return len(value)
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    return int(value.memory_usage(index=False, deep=False).sum())


def getpid() -> int:
    return os.getpid()
