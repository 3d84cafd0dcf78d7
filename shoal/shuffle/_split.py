"""Splitting an input partition by output partition, per destination worker.

One stable argsort of (destination, output partition) and one ``take`` per destination:
each destination gets one contiguous frame whose rows are grouped by output partition
(in their input order), with the row count of each. No boolean mask per partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shoal.shuffle._plan import owner_index

# destination -> (output partitions, rows of each, the rows or None when there are none)
Batches = dict[str, tuple[list[int], list[int], Any]]


def split_by_destination(
    df: Any,
    column: str,
    npartitions: int,
    participants: Sequence[str],
    parts_out: Sequence[int] | None = None,
) -> Batches:
    """The rows of ``df`` (without ``column``, the output partition of each row) for
    each participant, grouped by output partition. Rows of partitions not in
    ``parts_out`` (when given) are dropped. Every participant gets an entry."""
    import numpy as np

    codes = np.asarray(df[column].to_numpy(), dtype=np.int64)
    data = df.drop(columns=[column])
    if len(codes) and (codes.min() < 0 or codes.max() >= npartitions):
        bad = codes[(codes < 0) | (codes >= npartitions)][0]
        raise ValueError(
            f"column {column!r} holds {bad}, not an output partition in [0, {npartitions})"
        )
    if parts_out is not None:
        wanted = np.zeros(npartitions, dtype=bool)
        wanted[list(parts_out)] = True
        keep = wanted[codes]
        if not keep.all():
            codes = codes[keep]
            data = data[keep]
    n = len(participants)
    dest = np.array([owner_index(p, n) for p in range(npartitions)], dtype=np.int64)[codes]
    sort_key = dest * npartitions + codes
    # numpy's stable sort is a radix sort for 16-bit integers: 6x faster on 100k rows
    small = np.uint16 if n * npartitions <= 1 << 16 else np.uint32
    order = np.argsort(sort_key.astype(small), kind="stable")
    counts = np.bincount(sort_key, minlength=n * npartitions)
    ends = np.cumsum(counts)
    out: Batches = {}
    for d, address in enumerate(participants):
        lo = int(ends[d * npartitions - 1]) if d else 0
        hi = int(ends[(d + 1) * npartitions - 1])
        if hi == lo:
            out[address] = ([], [], None)
            continue
        mine = counts[d * npartitions : (d + 1) * npartitions]
        parts = np.flatnonzero(mine)
        out[address] = (parts.tolist(), mine[parts].tolist(), data.take(order[lo:hi]))
    return out
