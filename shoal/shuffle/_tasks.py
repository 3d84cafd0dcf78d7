"""The task functions of a P2P shuffle, run on shoal workers (referenced by the graph
that :mod:`shoal.shuffle._dask` builds).

The same graph computed by another scheduler (``dask.compute(..., scheduler="sync")``
while a shoal client is the default) runs in one process: the transfers then hand
their frames on as results, and each unpack selects its rows from all of them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from shoal.protocol import messages as m
from shoal.shuffle._split import split_by_destination


class Local:
    """What the tasks of a shuffle computed outside shoal workers pass on: the frames."""

    __slots__ = ("frames",)

    def __init__(self, frames: list[Any]):
        self.frames = frames


def _on_worker() -> bool:
    from shoal.server.worker import current_task

    return current_task() is not None


def _context(shuffle_id: str) -> tuple[Any, m.ShuffleRun, Any]:
    """(the worker's shuffle service, the run this task was sent for, the worker)."""
    from shoal.server.worker import current_task

    current = current_task()
    assert current is not None
    worker, key = current
    info = worker.shuffle.run_for(key)
    if info is None or info.id != shuffle_id:
        raise RuntimeError(
            f"P2P shuffle {shuffle_id}: task {key!r} came without its run (was it "
            "submitted without its shuffle mark?)"
        )
    return worker.shuffle, info, worker


def _report(service: Any, info: m.ShuffleRun, worker: Any) -> None:
    """Bytes sent and spilled go to the scheduler ahead of this task's result: queued
    on the scheduler connection (from the loop) before this thread returns."""
    sent, spilled = service.take_stats(info)
    loop, scheduler = worker._loop, worker.scheduler
    if not (sent or spilled) or loop is None or scheduler is None:
        return
    msg = m.ShuffleStats(info.id, info.run, sent, spilled)
    queued = threading.Event()

    def send() -> None:
        scheduler.send(msg)
        queued.set()

    loop.call_soon_threadsafe(send)
    queued.wait(10)  # (a closing loop may never run it: the stats are lost, nothing else)


def shuffle_transfer(
    df: Any,
    shuffle_id: str,
    input_partition: int,
    column: str,
    npartitions: int,
    parts_out: Sequence[int] | None,
) -> Any:
    """Send this input partition's rows to the owners of their output partitions;
    returns the run it was sent in."""
    if not _on_worker():
        return Local([df])
    service, info, worker = _context(shuffle_id)
    batches = split_by_destination(df, column, npartitions, info.participants, parts_out)
    service.send(info, input_partition, batches)
    _report(service, info, worker)
    return info.run


def shuffle_barrier(shuffle_id: str, *runs: Any) -> Any:
    """Every transfer is done (and acknowledged): the unpacks may start."""
    if not _on_worker():
        if not all(isinstance(r, Local) for r in runs):
            raise RuntimeError(f"P2P shuffle {shuffle_id}: transfers ran on shoal workers")
        return Local([f for r in runs for f in r.frames])
    _, info, _ = _context(shuffle_id)
    stale = sorted({r for r in runs if r != info.run})
    if stale:
        raise RuntimeError(
            f"P2P shuffle {shuffle_id}: transfers of run(s) {stale} answered for run "
            f"{info.run}; their pieces went to an older run"
        )
    return info.run


def shuffle_unpack(
    shuffle_id: str, partition: int, barrier_run: Any, meta: Any, ninputs: int, column: str
) -> Any:
    """Output ``partition``: its pieces from every input partition, in input order."""
    if isinstance(barrier_run, Local):  # not on shoal workers: select from every frame
        frames = [f[f[column] == partition].drop(columns=[column]) for f in barrier_run.frames]
        frames = [f for f in frames if len(f)]
    else:
        service, info, worker = _context(shuffle_id)
        frames = service.take(info, partition, ninputs)
        _report(service, info, worker)
    if not frames:
        return meta.drop(columns=[column])
    from dask.dataframe.dispatch import concat

    out = concat(frames) if len(frames) > 1 else frames[0].copy()
    return out
