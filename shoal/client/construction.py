"""Client construction as in Dask, ``Client.sync``, and the Client's repr.

``Client(n_workers=4, threads_per_worker=1, processes=False, memory_limit="2GB")``
starts a :class:`~shoal.deploy.local.LocalCluster` with those keywords (any of
LocalCluster's); ``Client(scheduler_file=path)`` connects to the address that
``shoal scheduler --scheduler-file`` wrote. A mixin of
:class:`~shoal.client.client.Client`.
"""

from __future__ import annotations

import contextlib
import html
import inspect
import json
import os
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from shoal.protocol import messages as m

T = TypeVar("T")


def address_from_scheduler_file(path: str | os.PathLike[str]) -> str:
    """The address that ``shoal scheduler --scheduler-file path`` wrote there."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"scheduler_file {os.fspath(path)!r} does not exist "
            "(written by `shoal scheduler --scheduler-file PATH` once it listens)"
        ) from None
    except ValueError as e:
        raise ValueError(f"scheduler_file {os.fspath(path)!r} is not JSON: {e}") from None
    address = data.get("address") if isinstance(data, dict) else None
    if not isinstance(address, str) or not address:
        raise ValueError(f"scheduler_file {os.fspath(path)!r} names no scheduler address")
    return address


def check_cluster_kwargs(address: Any, cluster_kwargs: dict[str, Any]) -> None:
    """Keywords for a new LocalCluster make sense only when no scheduler is given, and
    must be LocalCluster's."""
    if not cluster_kwargs:
        return
    if address is not None:
        raise TypeError(
            f"Client got LocalCluster keywords {sorted(cluster_kwargs)} and a scheduler "
            f"({address!r}): they only apply when the Client starts its own cluster"
        )
    from shoal.deploy.local import LocalCluster

    accepted = set(inspect.signature(LocalCluster).parameters)
    unknown = sorted(set(cluster_kwargs) - accepted)
    if unknown:
        raise TypeError(
            f"Client got unexpected keywords {unknown}: neither Client's nor LocalCluster's "
            f"(LocalCluster takes {sorted(accepted)})"
        )


def format_bytes(n: int | None) -> str:
    if not n:
        return "no limit" if n is None else "0 B"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.2f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")


def resources_text(workers: int, threads: int, memory: int) -> str:
    return f"workers={workers}, threads={threads}, memory={format_bytes(memory)}"


def html_table(title: str, rows: list[tuple[str, str]]) -> str:
    cells = "".join(
        f"<tr><th style='text-align: left'>{html.escape(k)}</th>"
        f"<td style='text-align: left'>{_html_value(k, v)}</td></tr>"
        for k, v in rows
    )
    return f"<div><h3 style='margin-bottom: 0.2em'>{html.escape(title)}</h3><table>{cells}</table></div>"


def _html_value(name: str, value: str) -> str:
    if name == "Dashboard":  # a link to open
        link = html.escape(value)
        return f"<a href='{link}' target='_blank'>{link}</a>"
    return html.escape(value)


class ConstructionMixin:
    asynchronous: bool
    id: str
    status: str
    scheduler_address: str
    cluster: Any
    _summary: m.ClusterState | None

    if TYPE_CHECKING:

        def _sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    def sync(
        self,
        func: Callable[..., Any],
        *args: Any,
        asynchronous: bool | None = None,
        callback_timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Dask's ``Client.sync``: call ``func(*args, **kwargs)`` (a coroutine function,
        or a plain one) on the client's event loop; a synchronous client waits for and
        returns its result, an asynchronous one returns the awaitable."""
        if asynchronous is None:
            asynchronous = self.asynchronous
        if asynchronous:
            return func(*args, **kwargs)

        async def call() -> Any:
            result = func(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        return self._sync(call(), callback_timeout)

    @classmethod
    def current(cls) -> Any:
        """The default client (the newest that was made the default and is still
        open), as Dask's; ValueError if there is none."""
        from shoal.client.graph import collections

        with collections._default_lock:
            if collections._defaults:
                return collections._defaults[-1]
        raise ValueError("no default client: create a Client first")

    @contextlib.contextmanager
    def as_current(self) -> Iterator[Any]:
        """Make this client the default within the block (Dask collections computed
        there use it), as Dask's."""
        from shoal.client.graph import collections

        collections.set_default(self)  # type: ignore[arg-type]
        try:
            yield self
        finally:
            collections.unset_default(self)  # type: ignore[arg-type]

    @staticmethod
    def futures_of(obj: Any) -> list[Any]:
        """The futures in ``obj`` (nested lists, dicts, Dask collections)."""
        from shoal.client.progress import futures_of

        return futures_of(obj)

    def write_scheduler_file(self, scheduler_file: str | os.PathLike[str]) -> None:
        """Write this client's scheduler address where ``Client(scheduler_file=)`` and
        ``shoal worker --scheduler-file`` read it."""
        if os.path.exists(scheduler_file):
            raise FileExistsError(f"scheduler file {os.fspath(scheduler_file)!r} exists already")
        with open(scheduler_file, "w") as f:
            json.dump({"address": self.scheduler_address}, f)

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's status page (None: the scheduler serves none), formatted
        with the link template (``SHOAL_DASHBOARD_LINK``, config ``shoal.dashboard.link``).
        With a cluster token, a fresh one-time login link to it each time."""
        from shoal.client.dashboard import client_dashboard_link

        return client_dashboard_link(self)

    def _resources(self) -> tuple[int, int, int] | None:
        """(workers, threads, memory limit) from the latest summary the scheduler
        pushed; None before any (no request is made: a repr must not block)."""
        s = self._summary
        if s is None:
            return None
        return s.workers, s.nthreads, s.memory_limit

    def __repr__(self) -> str:
        got = self._resources()
        where = f"scheduler={self.scheduler_address!r}"
        if got is None or self.status != "running":
            return f"<Client {self.id or '?'} {where} status={self.status}>"
        link = self.dashboard_link
        shown = f" dashboard={link!r}" if link else ""
        return f"<Client {self.id} {where} {resources_text(*got)}{shown}>"

    def _repr_html_(self) -> str:
        rows = [("Client", self.id or "?"), ("Scheduler", self.scheduler_address or "?")]
        rows.append(("Status", self.status))
        got = self._resources()
        if got is not None:
            workers, threads, memory = got
            rows += [
                ("Workers", str(workers)),
                ("Threads", str(threads)),
                ("Memory", format_bytes(memory)),
            ]
        if self.cluster is not None:
            rows.append(("Cluster", type(self.cluster).__name__))
        link = self.dashboard_link
        if link is not None:
            rows.append(("Dashboard", link))
        return html_table("Client", rows)
