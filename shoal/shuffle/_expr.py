"""The dask-expr expression of shoal's P2P shuffle (imports dask.dataframe: loaded only
once a shuffle is lowered under shoal)."""

from __future__ import annotations

from typing import Any

from dask._task_spec import Task, TaskRef
from dask.dataframe.dask_expr._shuffle import P2PShuffle

from shoal.shuffle import _dask
from shoal.shuffle._tasks import shuffle_barrier, shuffle_transfer, shuffle_unpack


class ShoalP2PShuffle(P2PShuffle):
    """shoal's P2P shuffle: a transfer task per input partition, a barrier, an unpack
    task per output partition. The rows are split by the (int) column
    ``partitioning_index``, which the output drops (as Dask's P2P)."""

    def _layer(self) -> dict:
        _dask._built["any"] = True
        token = self._name.split("-")[-1]
        column = self.partitioning_index
        if isinstance(column, list | tuple):
            if len(column) != 1:
                raise ValueError(f"a P2P shuffle needs one partition column, not {column!r}")
            column = column[0]
        npartitions = self.npartitions_out
        parts_out = list(self._partitions) if self._filtered else list(range(npartitions))
        wanted = tuple(parts_out) if self._filtered else None
        frame = self.frame
        transfer_name = f"shoal-shuffle-transfer-{token}"
        dsk: dict[Any, Any] = {}
        refs = []
        for i in range(frame.npartitions):
            t = Task(
                (transfer_name, i),
                shuffle_transfer,
                TaskRef((frame._name, i)),
                token,
                i,
                column,
                npartitions,
                wanted,
            )
            dsk[t.key] = t
            refs.append(t.ref())
        barrier = Task(f"shoal-shuffle-barrier-{token}", shuffle_barrier, token, *refs)
        dsk[barrier.key] = barrier
        meta = frame._meta
        for i, p in enumerate(parts_out):
            t = Task(
                (self._name, i),
                shuffle_unpack,
                token,
                p,
                barrier.ref(),
                meta,
                frame.npartitions,
                column,
            )
            dsk[t.key] = t
        return dsk
