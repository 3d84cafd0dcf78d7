"""Lanes: a client runs a one-task ``get`` on a worker directly, the scheduler told
after (see ``shoal/lanes/__init__.py`` for the design and its rules).

The scheduler grants a client a lane (``LaneRequest`` -> ``LaneGrant``) and tells the
worker (``LaneOpen``); either side is told when it closes (``LaneClosed``). The client
sends ``LaneRun`` to the worker, which answers ``LaneResult`` (or declines) and then
reports ``LaneRan`` to the scheduler, for the task stream and the durations; a run that
goes on for a while is announced (``LaneBusy``), so that it counts as a busy thread.
"""

from __future__ import annotations

from shoal.protocol.message_families.base import Key, Message, Payload
from shoal.protocol.message_families.tasks import TaskSpec

# --- client -> scheduler -------------------------------------------------------------


class LaneRequest(Message):
    """The client asks for a lane; answered by ``LaneGrant``."""

    request_id: int


# --- scheduler -> client -------------------------------------------------------------


class LaneGrant(Message):
    """``lane`` on the worker at ``worker``; ``lane`` empty: none granted (``reason``)."""

    request_id: int
    lane: str = ""
    worker: str = ""
    reason: str = ""


# --- scheduler -> client and worker --------------------------------------------------


class LaneClosed(Message):
    """``lane`` is no longer valid: the worker declines runs under it from now on.
    ``gone``: its worker left the cluster (a client waiting on a run there stops)."""

    lane: str
    reason: str = ""
    gone: bool = False


# --- scheduler -> worker -------------------------------------------------------------


class LaneOpen(Message):
    """The worker may run ``client``'s one-task gets presented under ``lane``."""

    lane: str
    client: str


# --- client -> worker ----------------------------------------------------------------


class LaneRun(Message):
    """Run ``task`` (no dependencies) and answer with its value. ``functions``: table
    entries this connection has not carried yet (content-addressed, as SubmitTasks')."""

    request_id: int
    lane: str
    task: TaskSpec
    functions: dict[str, bytes] = {}


# --- worker -> client ----------------------------------------------------------------


class LaneResult(Message):
    """``status`` "finished" (``payloads``: the value, its buffers in the frame), "erred"
    (``exception``, ``traceback``) or "declined" (``reason``: nothing ran; the client
    submits through the scheduler). ``output``: what the task printed, warned and
    logged (``shoal/server/output.py``'s entries)."""

    request_id: int
    status: str
    payloads: list[Payload] = []
    type_name: str = ""
    exception: Payload | None = None
    traceback: str = ""
    reason: str = ""
    output: bytes = b""

    def __post_init__(self) -> None:
        if self.status not in ("finished", "erred", "declined"):
            raise ValueError(f"unknown lane result status {self.status!r}")
        if self.status == "finished" and len(self.payloads) != 1:
            raise ValueError(f"a finished lane result with {len(self.payloads)} values")
        if self.status == "erred" and self.exception is None:
            raise ValueError("an erred lane result without an exception")


# --- worker -> scheduler -------------------------------------------------------------


class LaneBusy(Message):
    """A run of ``key`` under ``lane`` has gone on for a while (it is no tiny task): the
    scheduler counts a thread of the worker busy until the run's ``LaneRan``."""

    lane: str
    key: Key


class LaneRan(Message):
    """The worker ran ``key`` under ``lane`` (after answering the client): for the task
    stream and the prefix's durations. ``status``: "memory" or "erred"."""

    lane: str
    key: Key
    status: str
    start: float
    stop: float
    nbytes: int = 0
