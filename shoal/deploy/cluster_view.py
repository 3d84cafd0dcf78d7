"""What a LocalCluster shows of itself as Dask's does: ``workers``, ``scheduler``,
``dashboard_link``, and its repr (text and Jupyter HTML). A mixin of
:class:`~shoal.deploy.local.LocalCluster`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.client.construction import format_bytes, html_table


class ClusterViewMixin:
    scheduler_address: str
    processes: bool
    threads_per_worker: int
    memory_limit: int | None
    status: str
    _scheduler: Any
    dashboard_port: int
    security: Any
    _by_name: dict[str, Any]

    if TYPE_CHECKING:

        def _worker_names(self) -> list[str]: ...
        def _info_reply(self) -> Any: ...

    @property
    def workers(self) -> dict[str, Any]:
        """This cluster's workers by name, joined or starting: the ``Worker`` objects
        (``processes=False``) or the worker (nanny) processes as ``subprocess.Popen``."""
        names = self._worker_names()
        return {name: self._by_name[name] for name in names}

    @property
    def scheduler(self) -> Any:
        """The :class:`~shoal.server.scheduler.Scheduler` object when it runs in this
        process (``processes=False``); with ``processes=True``, where the scheduler is
        its own process, a read-only :class:`~shoal.deploy.scheduler_view.SchedulerView`
        of it (``address``, ``id``, ``workers`` with their pids, ...)."""
        if self._scheduler is None:
            from shoal.deploy.scheduler_view import SchedulerView

            if not self.scheduler_address:
                raise AttributeError("the cluster's scheduler has not started")
            return SchedulerView(self._info_reply)
        return self._scheduler

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's status page (None: ``dashboard_address=None``); with the
        cluster's token, a fresh one-time login link to it each time."""
        from shoal.client.dashboard import dashboard_link_for

        return dashboard_link_for(self.scheduler_address, self.dashboard_port, self.security)

    def _totals(self) -> tuple[int, int, int | None]:
        n = len(self._worker_names()) if self.status == "running" else 0
        memory = None if self.memory_limit is None else n * self.memory_limit
        return n, n * self.threads_per_worker, memory

    def __repr__(self) -> str:
        workers, threads, memory = self._totals()
        link = self.dashboard_link
        shown = f", dashboard={link!r}" if link else ""
        return (
            f"LocalCluster({self.scheduler_address!r}, workers={workers}, threads={threads}, "
            f"memory={format_bytes(memory)}, processes={self.processes}, status={self.status}"
            f"{shown})"
        )

    def _repr_html_(self) -> str:
        workers, threads, memory = self._totals()
        rows = [
            ("Scheduler", self.scheduler_address),
            ("Status", self.status),
            ("Workers", str(workers)),
            ("Threads", str(threads)),
            ("Memory", format_bytes(memory)),
            ("Processes", str(self.processes)),
        ]
        link = self.dashboard_link
        if link is not None:
            rows.append(("Dashboard", link))
        return html_table("LocalCluster", rows)
