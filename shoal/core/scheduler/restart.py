"""``client.retry`` and ``client.restart`` in the core.

Retry: erred keys run again, from the erred dependencies they failed through (those
whose own dependencies did not err) down, as Dask's ``stimulus_retry``.

Restart: every client's futures are cancelled (as Dask
does), datasets and fire-and-forget keys dropped, so that no task is wanted any more;
the workers' restart itself goes through their nannies (the client asks them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.core.scheduler.model import ClientRecord, TaskState
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

RESTART_REASON = "the cluster restarted (client.restart)"


class Restart:
    clients: dict[str, ClientRecord]
    tasks: dict[Key, TaskState]

    if TYPE_CHECKING:
        from shoal.core.comm import Comm

        comm: Comm
        datasets: dict[str, tuple[list[Key], bytes]]

        def _drop_dataset(self, name: str, stimulus_id: str) -> bool: ...

        def _transitions(self, recs: dict[TaskState, str], stimulus_id: str) -> None: ...

        def _release_wants(
            self, cs: ClientRecord, tasks: list[TaskState], stimulus_id: str
        ) -> None: ...

    def _restart(self, cs: ClientRecord, msg: m.RestartRequest) -> None:
        sid = msg.stimulus_id or "restart"
        for name in list(self.datasets):
            self._drop_dataset(name, sid)
        for client in list(self.clients.values()):
            wanted = list(client.wants)
            for ts in wanted:
                self.comm.send_client(client.id, m.KeyCancelled(ts.key, RESTART_REASON, sid))
            self._release_wants(client, wanted, sid)
        self.comm.send_client(cs.id, m.Ack(msg.request_id))

    def _retry_keys(self, cs: ClientRecord, msg: m.RetryKeys) -> None:
        order: list[TaskState] = []  # erred tasks, each after those depending on it
        seen: set[TaskState] = set()
        stack = [ts for k in msg.keys if (ts := self.tasks.get(k)) is not None]
        while stack:
            ts = stack.pop()
            if ts in seen or ts.state != "erred":
                continue
            seen.add(ts)
            order.append(ts)
            stack.extend(dts for dts in ts.dependencies if dts.state == "erred")
        for ts in reversed(order):  # dependencies first: each waits on fresh inputs
            if ts.state == "erred":
                self._transitions({ts: "waiting"}, msg.stimulus_id)
