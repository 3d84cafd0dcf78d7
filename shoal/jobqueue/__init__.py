"""Clusters whose workers run in jobs of a queue system, with dask-jobqueue's
conventions: ``SLURMCluster``, ``SGECluster``, ``PBSCluster``.

    from shoal import Client
    from shoal.jobqueue import SLURMCluster

    cluster = SLURMCluster(cores=4, memory="16GB", walltime="01:00:00", queue="normal")
    print(cluster.job_script())
    cluster.adapt(minimum_jobs=1, maximum_jobs=10)
    client = Client(cluster)

See :mod:`shoal.jobqueue._cluster` for how jobs are tracked and replaced.
"""

from __future__ import annotations

from typing import Any

from shoal.jobqueue._cluster import JobQueueCluster
from shoal.jobqueue._job import JobSystem
from shoal.jobqueue._pbs import PBSJob
from shoal.jobqueue._sge import SGEJob
from shoal.jobqueue._slurm import SLURMJob
from shoal.jobqueue._tracker import JobCommandError


class SLURMCluster(JobQueueCluster):
    """Workers in SLURM jobs (``sbatch``); see :class:`JobQueueCluster`."""

    job_system = SLURMJob


class SGECluster(JobQueueCluster):
    """Workers in Grid Engine jobs (``qsub``). ``resource_spec`` goes to ``#$ -l``
    (e.g. ``"h_vmem=4G"``); ``parallel_environment`` asks ``#$ -pe NAME cores``."""

    job_system = SGEJob

    def __init__(
        self,
        n_workers: int = 0,
        *,
        resource_spec: str | None = None,
        parallel_environment: str | None = None,
        **kwargs: Any,
    ):
        kwargs.setdefault("job_system", SGEJob(resource_spec, parallel_environment))
        super().__init__(n_workers, **kwargs)


class PBSCluster(JobQueueCluster):
    """Workers in PBS jobs (``qsub``). ``resource_spec`` replaces the default
    ``select=1:ncpus=CORES:mem=MEMORY`` of ``#PBS -l``."""

    job_system = PBSJob

    def __init__(self, n_workers: int = 0, *, resource_spec: str | None = None, **kwargs: Any):
        kwargs.setdefault("job_system", PBSJob(resource_spec))
        super().__init__(n_workers, **kwargs)


__all__ = [
    "JobCommandError",
    "JobQueueCluster",
    "JobSystem",
    "PBSCluster",
    "SGECluster",
    "SLURMCluster",
]
