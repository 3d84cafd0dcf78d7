"""Plugins: code of yours that runs inside the scheduler, the workers or the nannies
and is told what they do (Dask's plugin API; see the README's Plugins section)."""

from shoal.plugins.base import NannyPlugin, SchedulerPlugin, WorkerPlugin

__all__ = ["NannyPlugin", "SchedulerPlugin", "WorkerPlugin"]
