"""Keys kept alive by the scheduler on behalf of no connected client: published
datasets (``client.publish_dataset``) and fire-and-forget tasks.

Each holder is a client record without a connection ("dataset:NAME",
"fire-and-forget"): it wants its keys as a client would, so every invariant about
wanted keys holds unchanged, and messages to it go nowhere. Fire-and-forget keys are
let go once done (in memory or erred), as in Dask."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.core.scheduler.model import ClientRecord, TaskState
from shoal.protocol import messages as m
from shoal.protocol.messages import Key

FIRE_AND_FORGET = "fire-and-forget"
DATASET_HOLDER = "dataset:"
DATASET_OPS = ("get", "list", "unpublish")


class Datasets:
    """Dataset and fire-and-forget methods and state of
    :class:`~shoal.core.scheduler.SchedulerState`."""

    tasks: dict[Key, TaskState]
    clients: dict[str, ClientRecord]

    if TYPE_CHECKING:
        from shoal.core.comm import Comm

        comm: Comm

        def _want(self, cs: ClientRecord, ts: TaskState, stimulus_id: str) -> None: ...

        def _release_wants(
            self, cs: ClientRecord, tasks: list[TaskState], stimulus_id: str
        ) -> None: ...

    def _init_datasets(self) -> None:
        self.datasets: dict[str, tuple[list[Key], bytes]] = {}  # name -> (keys, pickled)
        self.fired_done: list[TaskState] = []  # fire-and-forget keys done since the last batch

    def _holder(self, holder_id: str) -> ClientRecord:
        cs = self.clients.get(holder_id)
        if cs is None:
            cs = self.clients[holder_id] = ClientRecord(holder_id)
        return cs

    def note_done(self, ts: TaskState) -> None:
        """``ts`` went to memory or erred: a fire-and-forget holder lets it go at the
        end of the batch."""
        for cs in ts.who_wants:
            if cs.id == FIRE_AND_FORGET:
                self.fired_done.append(ts)
                return

    def _fire_and_forget(self, cs: ClientRecord, msg: m.FireAndForget) -> None:
        holder = self._holder(FIRE_AND_FORGET)
        for key in msg.keys:
            ts = self.tasks.get(key)
            if ts is None:  # released already by its client: nothing to keep
                continue
            self._want(holder, ts, msg.stimulus_id)
            if ts.state in ("memory", "erred"):
                self.fired_done.append(ts)

    def release_fired(self, stimulus_id: str) -> None:
        holder = self.clients.get(FIRE_AND_FORGET)
        done, self.fired_done = self.fired_done, []
        if holder is not None:
            self._release_wants(holder, [ts for ts in done if ts in holder.wants], stimulus_id)

    def _publish_dataset(self, cs: ClientRecord, msg: m.PublishDataset) -> None:
        sid = f"publish-{msg.name}"
        if not msg.name:
            return self._dataset_reply(cs, msg.request_id, error="a dataset needs a name")
        if msg.name in self.datasets and not msg.override:
            return self._dataset_reply(
                cs, msg.request_id, error=f"a dataset named {msg.name!r} already exists"
            )
        missing = [k for k in msg.keys if k not in self.tasks]
        if missing:
            return self._dataset_reply(
                cs, msg.request_id, error=f"keys unknown to the scheduler: {missing[:5]}"
            )
        self._drop_dataset(msg.name, sid)
        holder = self._holder(DATASET_HOLDER + msg.name)
        for key in msg.keys:
            self._want(holder, self.tasks[key], sid)
        self.datasets[msg.name] = (list(msg.keys), msg.data)
        self._dataset_reply(cs, msg.request_id, names=[msg.name])

    def _drop_dataset(self, name: str, stimulus_id: str) -> bool:
        if self.datasets.pop(name, None) is None:
            return False
        holder = self.clients.pop(DATASET_HOLDER + name, None)
        if holder is not None:
            self._release_wants(holder, list(holder.wants), stimulus_id)
        return True

    def _dataset_request(self, cs: ClientRecord, msg: m.DatasetRequest) -> None:
        if msg.op == "list":
            return self._dataset_reply(cs, msg.request_id, names=sorted(self.datasets))
        if msg.op not in DATASET_OPS:
            return self._dataset_reply(cs, msg.request_id, error=f"unknown op {msg.op!r}")
        if msg.name not in self.datasets:
            return self._dataset_reply(cs, msg.request_id, error=f"no dataset {msg.name!r}")
        if msg.op == "unpublish":
            self._drop_dataset(msg.name, f"unpublish-{msg.name}")
            return self._dataset_reply(cs, msg.request_id, names=[msg.name])
        keys, data = self.datasets[msg.name]
        # The client holds the keys once it has made its futures (it sends WantKeys).
        self._dataset_reply(cs, msg.request_id, names=[msg.name], keys=keys, data=data)

    def _dataset_reply(self, cs: ClientRecord, request_id: int, **fields: object) -> None:
        self.comm.send_client(cs.id, m.DatasetReply(request_id, **fields))  # type: ignore[arg-type]
