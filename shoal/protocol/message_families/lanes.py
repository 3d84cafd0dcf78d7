"""Lanes: a client runs a one-task ``get``, or a small graph's, on a worker directly,
the scheduler told after (see ``shoal/lanes/__init__.py`` for the design and its rules).

The scheduler grants a client a lane (``LaneRequest`` -> ``LaneGrant``) and tells the
worker (``LaneOpen``); either side is told when it closes (``LaneClosed``). The client
sends ``LaneRun`` (one task) or ``LaneRunGraph`` (a small graph) to the worker, which
answers ``LaneResult`` (or declines) and then reports ``LaneRan`` for each task it ran to
the scheduler, for the task stream and the durations; a run that goes on for a while is
announced (``LaneBusy``), so that it counts as a busy thread. The scheduler shares the
prefixes' durations with the workers that have lanes (``LaneDurations``): a worker
takes a graph only when they say it is short.
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


class LaneDurations(Message):
    """Recent seconds per task prefix (``TaskPrefix.recent_duration``): all the
    scheduler knows when a worker's first lane opens, then those that changed."""

    durations: dict[str, float]


# --- client -> worker ----------------------------------------------------------------


class LaneRun(Message):
    """Run ``task`` (no dependencies) and answer with its value. ``functions``: table
    entries this connection has not carried yet (content-addressed, as SubmitTasks')."""

    request_id: int
    lane: str
    task: TaskSpec
    functions: dict[str, bytes] = {}


class LaneRunGraph(Message):
    """Run ``tasks`` (each after its dependencies, which are all among them) and answer
    with the values of ``keys``, in that order."""

    request_id: int
    lane: str
    tasks: list[TaskSpec]
    keys: list[Key]
    functions: dict[str, bytes] = {}


# --- worker -> client ----------------------------------------------------------------


class LaneResult(Message):
    """``status`` "finished" (``payloads``: the value of each key asked for, their
    buffers in the frame), "erred" (``exception``, ``traceback``: the first task that
    failed) or "declined" (``reason``: no answer; the client submits through the
    scheduler). ``output``: what the tasks printed, warned and logged
    (``shoal/server/output.py``'s entries). ``too_long``: a graph that stopped part
    way, run too long or holding too much (the client stops offering its kind for a
    while: its estimate was wrong)."""

    request_id: int
    status: str
    payloads: list[Payload] = []
    type_name: str = ""
    exception: Payload | None = None
    traceback: str = ""
    reason: str = ""
    output: bytes = b""
    too_long: bool = False

    def __post_init__(self) -> None:
        if self.status not in ("finished", "erred", "declined"):
            raise ValueError(f"unknown lane result status {self.status!r}")
        if self.status == "finished" and not self.payloads:
            raise ValueError("a finished lane result with no value")
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
    stream and the prefix's durations. ``status``: "memory" or "erred". A graph's run
    is reported task by task, all together at its end; its ``LaneBusy`` names its first
    task."""

    lane: str
    key: Key
    status: str
    start: float
    stop: float
    nbytes: int = 0
