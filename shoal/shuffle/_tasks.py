"""The task functions of a P2P shuffle, run on shoal workers (referenced by the graph
that :mod:`shoal.shuffle._dask` builds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shoal.protocol import messages as m
from shoal.shuffle._split import split_by_destination


def _context(shuffle_id: str) -> tuple[Any, m.ShuffleRun, Any]:
    """(the worker's shuffle service, the run this task was sent for, the worker)."""
    from shoal.server.worker import current_task

    current = current_task()
    if current is None:
        raise RuntimeError(
            f"P2P shuffle {shuffle_id}: its tasks run only on shoal workers (compute it "
            "with a shoal Client, or choose shuffle_method='tasks')"
        )
    worker, key = current
    info = worker.shuffle.run_for(key)
    if info is None or info.id != shuffle_id:
        raise RuntimeError(
            f"P2P shuffle {shuffle_id}: task {key!r} came without its run (was it "
            "submitted without its shuffle mark?)"
        )
    return worker.shuffle, info, worker


def _report(service: Any, info: m.ShuffleRun, worker: Any) -> None:
    """Bytes sent and spilled go to the scheduler ahead of this task's result."""
    sent, spilled = service.take_stats(info)
    if (sent or spilled) and worker._loop is not None and worker.scheduler is not None:
        msg = m.ShuffleStats(info.id, info.run, sent, spilled)
        worker._loop.call_soon_threadsafe(worker.scheduler.send, msg)


def shuffle_transfer(
    df: Any,
    shuffle_id: str,
    input_partition: int,
    column: str,
    npartitions: int,
    parts_out: Sequence[int] | None,
) -> int:
    """Send this input partition's rows to the owners of their output partitions;
    returns the run it was sent in."""
    service, info, worker = _context(shuffle_id)
    batches = split_by_destination(df, column, npartitions, info.participants, parts_out)
    service.send(info, input_partition, batches)
    _report(service, info, worker)
    return info.run


def shuffle_barrier(shuffle_id: str, *runs: int) -> int:
    """Every transfer is done (and acknowledged): the unpacks may start."""
    _, info, _ = _context(shuffle_id)
    stale = sorted({r for r in runs if r != info.run})
    if stale:
        raise RuntimeError(
            f"P2P shuffle {shuffle_id}: transfers of run(s) {stale} answered for run "
            f"{info.run}; their pieces went to an older run"
        )
    return info.run


def shuffle_unpack(
    shuffle_id: str, partition: int, barrier_run: int, meta: Any, ninputs: int, column: str
) -> Any:
    """Output ``partition``: its pieces from every input partition, in input order."""
    service, info, worker = _context(shuffle_id)
    pieces = service.take(info, partition, ninputs)
    _report(service, info, worker)
    empty = meta.drop(columns=[column])
    if not pieces:
        return empty
    from dask.dataframe.dispatch import concat

    frames = [frame for _, frame in pieces]
    out = concat(frames) if len(frames) > 1 else frames[0].copy()
    return out
