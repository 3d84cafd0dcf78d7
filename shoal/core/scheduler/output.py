"""Task output (prints, warnings, log records; ``shoal/server/output.py``) routed to the
client of the task: a mixin of :class:`~shoal.core.scheduler.SchedulerState`.

The data stays opaque bytes here. It goes to the clients that want the key, else (an
intermediate task of a graph) to the client that first submitted to the task's group,
if still connected; only to clients that did not opt out (``ForwardOutput``)."""

from __future__ import annotations

from shoal.core.comm import Comm
from shoal.core.scheduler.model import ClientRecord, TaskState, WorkerRecord
from shoal.protocol import messages as m
from shoal.protocol.messages import Key


class OutputRouting:
    tasks: dict[Key, TaskState]
    clients: dict[str, ClientRecord]
    comm: Comm

    def _task_output(self, ws: WorkerRecord, msg: m.TaskOutput) -> None:
        ts = self.tasks.get(msg.key)
        if ts is None:
            return  # forgotten meanwhile: nobody to tell
        targets = [cs for cs in ts.who_wants if cs.forward_output]
        if not ts.who_wants:
            owner = ts.group.owner
            if owner is not None and owner.forward_output and self.clients.get(owner.id) is owner:
                targets = [owner]
        if targets:
            out = m.TaskOutput(msg.key, ws.address, msg.data)
            for cs in targets:
                self.comm.send_client(cs.id, out)

    def _forward_output(self, cs: ClientRecord, msg: m.ForwardOutput) -> None:
        cs.forward_output = msg.enabled
