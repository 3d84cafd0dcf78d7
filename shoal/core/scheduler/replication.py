"""``client.replicate``: copies of keys in memory on more workers, made by the copy
machinery of retirement (``CopyKeys``: the target fetches from the holders and reports
``AddKeys``, which records the replica)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.core.scheduler.model import ClientRecord, TaskState, WorkerRecord
from shoal.protocol import messages as m
from shoal.protocol.messages import Key


class Replication:
    tasks: dict[Key, TaskState]
    runnable: dict[str, WorkerRecord]

    if TYPE_CHECKING:
        from shoal.core.comm import Comm
        from shoal.core.scheduler.membership import Retirement

        retiring: dict[str, Retirement]

        comm: Comm

        def _find_worker(self, name: str) -> WorkerRecord | None: ...

    def _replicate_keys(self, cs: ClientRecord, msg: m.ReplicateKeys) -> None:
        if msg.workers:
            found = (self._find_worker(name) for name in msg.workers)
            targets = [w for w in found if w is not None and w.address in self.runnable]
        else:
            targets = list(self.runnable.values())
        targets = [w for w in targets if w.address not in self.retiring]
        if not targets:
            return
        wanted = len(targets) if msg.n < 0 else min(msg.n, len(targets))
        load = {w: w.nbytes for w in targets}  # fill the emptiest first
        asks: dict[WorkerRecord, list[m.DepInfo]] = {}
        for key in msg.keys:
            ts = self.tasks.get(key)
            if ts is None or ts.state != "memory" or not ts.who_has:
                continue
            missing = wanted - sum(1 for w in targets if w in ts.who_has)
            if missing <= 0:
                continue
            holders = [w.address for w in ts.who_has]
            free = sorted(
                (w for w in targets if w not in ts.who_has), key=lambda w: (load[w], w.address)
            )
            for to in free[:missing]:
                load[to] += ts.nbytes
                asks.setdefault(to, []).append(m.DepInfo(ts.key, ts.nbytes, holders))
        for to, deps in asks.items():
            self.comm.send_worker(to.address, m.CopyKeys(deps, msg.stimulus_id))
