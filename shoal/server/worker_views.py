"""Read-only snapshots of the scheduler's workers, in the shape Dask users read from
``Scheduler.workers`` (``w.pid``, ``w.name``, ...): the in-process scheduler's
``workers`` and the ``cluster.scheduler`` view of a process-based LocalCluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from shoal.protocol import messages as m


@dataclass(frozen=True)
class WorkerView:
    """One worker as the scheduler knows it (the fields Dask's ``WorkerState`` has
    under the same names)."""

    address: str
    name: str
    host: str
    pid: int
    nthreads: int
    memory_limit: int
    status: str
    nbytes: int  # managed bytes of the keys it holds
    processing: int  # tasks assigned to it and not finished
    resources: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, info: m.WorkerInfo) -> WorkerView:
        return cls(
            info.address,
            info.name,
            info.host,
            info.pid,
            info.nthreads,
            info.memory_limit,
            info.status,
            info.nbytes,
            info.processing,
            dict(info.resources),
        )


def worker_views(infos: list[m.WorkerInfo]) -> dict[str, WorkerView]:
    return {info.address: WorkerView.of(info) for info in infos}
