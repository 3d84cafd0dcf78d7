"""Data and checks of the shuffle benchmarks (``p2p_shuffle.py``, ``adaptive_shuffle.py``).

Workers of both systems import these functions by name. The frames are made inside the
workers, partition by partition, from a seed, so the client never holds them:

* events (``dask.datasets.timeseries``-like): a timestamp index (one row per second),
  ``id`` (int64, uniform in ``[0, keys)``), ``name`` (string from 26 first names),
  ``x`` and ``y`` (float64 in [-1, 1));
* keys: one row per ``id`` in ``[0, keys)`` with a float64 ``z``, the second frame of
  the merge (so the inner merge has exactly one row per event).

A result is checked by reducing it on the cluster to one row per partition
(``summarize``) and comparing the sums with ``reference``, computed in the client one
partition at a time: rows, the sum of ``id``, the sum of the bit patterns of ``x`` (and
of ``z`` after a merge) modulo 2**64, and the number of distinct ids per partition
added up. That last figure equals the number of distinct ids overall only if no id is
in two partitions, i.e. if the frame really was partitioned on ``id``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

NAMES = [
    "Alice",
    "Bob",
    "Charlie",
    "Dan",
    "Edith",
    "Frank",
    "George",
    "Hannah",
    "Ingrid",
    "Jerry",
    "Kevin",
    "Laura",
    "Michael",
    "Norbert",
    "Oliver",
    "Patricia",
    "Quinn",
    "Ray",
    "Sarah",
    "Tim",
    "Ursula",
    "Victor",
    "Wendy",
    "Xavier",
    "Yvonne",
    "Zelda",
]
START = np.datetime64("2000-01-01T00:00:00", "s")
ROWS_PER_PARTITION = 100_000
MIN_PARTITIONS = 4  # fewer input partitions than this and dask may broadcast the merge
MASK = 2**64 - 1


def bounds(rows: int, per_partition: int = ROWS_PER_PARTITION) -> list[tuple[int, int, int]]:
    """``(partition, first row, end row)`` for ``rows`` rows in at least 4 partitions."""
    if rows < MIN_PARTITIONS:
        raise ValueError(f"need at least {MIN_PARTITIONS} rows, got {rows}")
    n = max(MIN_PARTITIONS, math.ceil(rows / per_partition))
    edges = [rows * i // n for i in range(n + 1)]
    return [(i, edges[i], edges[i + 1]) for i in range(n)]


def n_keys(rows: int) -> int:
    """Size of the keys frame for an events frame of ``rows`` rows: a tenth of it."""
    return max(MIN_PARTITIONS, rows // 10)


def make_events(part: tuple[int, int, int], keys: int, seed: int, tag: str = "") -> pd.DataFrame:
    """One partition of the events frame. ``tag`` only changes the task keys of a run."""
    i, first, end = part
    rng = np.random.default_rng([seed, 1, i])
    n = end - first
    index = pd.DatetimeIndex(START + np.arange(first, end), name="timestamp")
    codes = rng.integers(0, len(NAMES), n)
    return pd.DataFrame(
        {
            "id": rng.integers(0, keys, n),
            "name": pd.array(np.asarray(NAMES, dtype=object)[codes], dtype="string[pyarrow]"),
            "x": rng.random(n) * 2 - 1,
            "y": rng.random(n) * 2 - 1,
        },
        index=index,
    )


def make_keys(part: tuple[int, int, int], seed: int, tag: str = "") -> pd.DataFrame:
    """One partition of the keys frame: ids ``first..end-1`` and their ``z``."""
    i, first, end = part
    rng = np.random.default_rng([seed, 2, i])
    return pd.DataFrame({"id": np.arange(first, end, dtype=np.int64), "z": rng.random(end - first)})


def bits_sum(values: Any) -> int:
    """Sum of the float64 bit patterns modulo 2**64 (order-independent, exact)."""
    return int(np.asarray(values, dtype=np.float64).view(np.uint64).sum(dtype=np.uint64))


SUMMARY_META = pd.DataFrame(
    {
        "rows": pd.Series([], dtype="int64"),
        "ids": pd.Series([], dtype="int64"),
        "id_sum": pd.Series([], dtype="int64"),
        "x_bits": pd.Series([], dtype="uint64"),
        "z_bits": pd.Series([], dtype="uint64"),
    }
)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row for one partition: what ``Summary`` adds up."""
    z = bits_sum(df["z"]) if "z" in df.columns else 0
    return pd.DataFrame(
        {
            "rows": [len(df)],
            "ids": [df["id"].nunique()],
            "id_sum": [int(df["id"].sum())],
            "x_bits": np.array([bits_sum(df["x"])], dtype=np.uint64),
            "z_bits": np.array([z], dtype=np.uint64),
        }
    )


@dataclass(frozen=True)
class Summary:
    rows: int
    ids: int  # distinct ids per partition, added up
    id_sum: int
    x_bits: int
    z_bits: int

    @classmethod
    def of(cls, parts: pd.DataFrame) -> Summary:
        """Add up the per-partition rows of ``summarize``."""
        return cls(
            rows=int(parts["rows"].sum()),
            ids=int(parts["ids"].sum()),
            id_sum=int(parts["id_sum"].sum()),
            x_bits=sum(int(v) for v in parts["x_bits"]) & MASK,
            z_bits=sum(int(v) for v in parts["z_bits"]) & MASK,
        )

    def mismatch(self, expected: Summary) -> str | None:
        """None if equal, else which figures differ."""
        wrong = [
            f"{f}: got {getattr(self, f)}, expected {getattr(expected, f)}"
            for f in ("rows", "ids", "id_sum", "x_bits", "z_bits")
            if getattr(self, f) != getattr(expected, f)
        ]
        return "; ".join(wrong) or None


@dataclass(frozen=True)
class Reference:
    shuffle: Summary  # the events frame partitioned on id
    merge: Summary  # events inner-merged with keys on id
    nbytes: int  # the events frame in memory (deep), all partitions
    keys_nbytes: int


def reference(
    rows: int, seed: int, pandas_check: bool = False, per_partition: int = ROWS_PER_PARTITION
) -> Reference:
    """The expected summaries, one events partition at a time (the keys frame is a
    tenth of the events; the seed is per partition, so ``per_partition`` must be that of
    ``frames``). With ``pandas_check`` (small sizes) the whole frames are
    also built, shuffled and merged with pandas, and both answers must agree."""
    keys = n_keys(rows)
    key_parts = [make_keys(p, seed) for p in bounds(keys)]
    z = np.concatenate([k["z"].to_numpy() for k in key_parts])
    seen = np.zeros(keys, dtype=bool)
    n = id_sum = x_bits = z_bits = nbytes = 0
    events = []
    for part in bounds(rows, per_partition):
        df = make_events(part, keys, seed)
        ids = df["id"].to_numpy()
        seen[ids] = True
        n += len(df)
        id_sum += int(ids.sum())
        x_bits += bits_sum(df["x"])
        z_bits += bits_sum(z[ids])
        nbytes += int(df.memory_usage(deep=True).sum())
        if pandas_check:
            events.append(df)
    shuffled = Summary(n, int(seen.sum()), id_sum, x_bits & MASK, 0)
    merged = Summary(n, int(seen.sum()), id_sum, x_bits & MASK, z_bits & MASK)
    keys_nbytes = sum(int(k.memory_usage(deep=True).sum()) for k in key_parts)
    ref = Reference(shuffled, merged, nbytes, keys_nbytes)
    if pandas_check:
        _check_with_pandas(ref, pd.concat(events), pd.concat(key_parts))
    return ref


def _check_with_pandas(ref: Reference, events: pd.DataFrame, keys: pd.DataFrame) -> None:
    # One partition holding everything: its distinct ids are those of the frame.
    got = Summary.of(summarize(events))
    merged = Summary.of(summarize(events.merge(keys, on="id", how="inner")))
    for what, have, want in (("shuffle", got, ref.shuffle), ("merge", merged, ref.merge)):
        wrong = have.mismatch(want)
        if wrong:
            raise AssertionError(f"pandas and the streamed reference differ ({what}): {wrong}")


def frames(
    rows: int, seed: int, tag: str, per_partition: int = ROWS_PER_PARTITION
) -> tuple[Any, Any]:
    """The events and keys frames as dask collections made in the workers."""
    import dask.dataframe as dd

    keys = n_keys(rows)
    meta_events = make_events((0, 0, 0), keys, seed)
    events = dd.from_map(
        make_events,
        bounds(rows, per_partition),
        keys=keys,
        seed=seed,
        tag=tag,
        meta=meta_events,
        label="make-events",
    )
    keys_frame = dd.from_map(
        make_keys,
        bounds(keys),
        seed=seed,
        tag=tag,
        meta=make_keys((0, 0, 0), seed),
        label="make-keys",
    )
    return events, keys_frame


def shuffle_summary(events: Any, method: str | None) -> Any:
    """The events shuffled on ``id``, reduced to one row per output partition."""
    kwargs = {} if method is None else {"shuffle_method": method}
    return events.shuffle("id", **kwargs).map_partitions(summarize, meta=SUMMARY_META)


def merge_summary(events: Any, keys: Any, method: str | None) -> Any:
    """The inner merge of events and keys on ``id``, one row per output partition."""
    kwargs = {} if method is None else {"shuffle_method": method}
    merged = events.merge(keys, on="id", how="inner", **kwargs)
    return merged.map_partitions(summarize, meta=SUMMARY_META)


def frame_only_summary(events: Any) -> Any:
    """No shuffle: making the events and reducing them (the floor of both operations)."""
    return events.map_partitions(summarize, meta=SUMMARY_META)


def dask_p2p_bytes(dask_worker: Any) -> dict[str, float]:
    """A Dask worker's P2P byte counters so far (run there by ``Client.run``): bytes cut
    into shards and sent ("moved") and bytes its P2P buffers wrote to disk ("spilled")."""
    out = {"moved": 0.0, "spilled": 0.0}
    for key, value in dask_worker.digests_total.items():
        if isinstance(key, tuple) and key[0] == "p2p" and key[-1] == "bytes":
            if key[-2] == "disk-write":
                out["spilled"] += value
            elif key[-2] == "shards":
                out["moved"] += value
    return out
