"""Elastic clusters: the P2P shuffle (shoal/shuffle), pins that hold workers, and
scaling (``cluster.scale`` and adaptive).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from shoal.protocol.message_families.base import (
    Message,
    Payload,
)

# --- P2P shuffle (shoal/shuffle) -----------------------------------------------------


class ShuffleMark(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """Client -> scheduler, on a TaskSpec: this task is part of P2P shuffle ``id``.
    ``role`` is "transfer" (``partition``: its input partition), "barrier", or
    "unpack" (``partition``: its output partition). The scheduler reads only this,
    never the task's data."""

    id: str
    role: str
    partition: int = -1


class ShuffleRun(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """Scheduler -> worker, on a ComputeTask: the run of shuffle ``id`` the task
    belongs to. ``run`` grows with every (re)start; output partition ``p`` belongs
    to ``participants[p % len(participants)]``."""

    id: str
    run: int
    participants: list[str]


class ShuffleData(Message):
    """Worker -> worker: the rows of input partition ``input_partition`` that go to
    output partitions ``partitions`` (``counts`` rows each, in that order), as one
    pickled frame (``payloads``: none when no row goes to this worker; it is still
    sent: it says that input is done here). Answered by Ack."""

    request_id: int
    id: str
    run: int
    input_partition: int
    partitions: list[int]
    counts: list[int]
    payloads: list[Payload] = []


class ShuffleRestart(Message):
    """Scheduler -> worker: shuffle ``id`` restarts as ``run``: drop the data of
    earlier runs; tasks of earlier runs that wait end (their results are discarded)."""

    id: str
    run: int
    stimulus_id: str = ""


class ShuffleForget(Message):
    """Scheduler -> worker: shuffle ``id`` finished, failed or was forgotten: drop
    everything of it, and refuse data of runs up to ``run`` from now on."""

    id: str
    run: int
    stimulus_id: str = ""


class ShuffleStats(Message):
    """Worker -> scheduler: bytes this worker sent and spilled for shuffle ``id``'s
    ``run`` since its last report (sent before the result of the task that did it)."""

    id: str
    run: int
    sent: int = 0
    spilled: int = 0
    stimulus_id: str = ""


# --- pins ----------------------------------------------------------------------------


class PinInfo(msgspec.Struct, array_like=True, gc=False):
    """One pin on a worker, as ``scheduler_info`` shows it."""

    id: int
    reason: str
    owner: str  # "client:<id>", "shuffle:<id>", ...
    expires: float | None = None  # wall-clock time; None: held until released


class PinWorkers(Message):
    """Client -> scheduler: pin these workers (addresses or names) for this client;
    with ``lease`` seconds, the pin expires unless renewed. Answered by PinReply."""

    request_id: int
    workers: list[str]
    reason: str
    lease: float | None = None
    stimulus_id: str = ""


class ReleasePin(Message):
    """Client -> scheduler: release one of this client's pins (PinReply, ``done`` False
    if it was gone already)."""

    request_id: int
    pin_id: int
    stimulus_id: str = ""


class RenewPin(Message):
    """Client -> scheduler: restart the lease of one of this client's pins."""

    request_id: int
    pin_id: int
    stimulus_id: str = ""


class PinReply(Message):
    request_id: int
    pin_id: int = 0
    workers: list[str] = []  # addresses
    expires: float | None = None
    done: bool = True  # False: the pin was gone already
    error: str = ""  # the request was refused: why (an unknown worker, a bad lease)


# A cluster (LocalCluster, a job-queue cluster) asks the scheduler what to do; the
# scheduler decides (the adaptive policy and which workers to close are in the core).

# --- scaling: scale and adapt --------------------------------------------------------


Count = Annotated[int, msgspec.Meta(ge=0)]


class ScaleRequest(Message):
    """Cluster -> scheduler: ``n >= 0``: run ``n`` workers (``cluster.scale(n)``);
    ``n == -1``: as many as the adaptive policy with these settings says (its memory
    of lower proposals is kept per client and ``session``). ``workers``: the names of
    the workers the cluster runs, joined or still starting. The scheduler retires the
    workers to close itself and answers :class:`ScaleReply`."""

    request_id: int
    workers: list[str]
    n: Annotated[int, msgspec.Meta(ge=-1)] = -1
    session: str = ""
    minimum: Count = 0
    maximum: Annotated[int, msgspec.Meta(ge=-1)] = -1  # -1: no maximum
    target_duration: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    wait_count: Annotated[int, msgspec.Meta(ge=1)] = 3
    default_task_duration: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    threads_per_worker: Annotated[int, msgspec.Meta(ge=1)] = 1  # of workers it would start
    # Seconds: a worker whose lifetime ends sooner than this is leaving already, not
    # counted, so that its replacement starts now (a job-queue cluster: job start-up).
    replace_ahead: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class ScaleReply(Message):
    """Scheduler -> cluster: start ``start`` workers; stop ``stop`` (started, not yet
    joined); ``closing`` are being retired by the scheduler (they exit by themselves
    once their data is copied); ``resumed``: retirements cancelled by this scale-up.
    ``error``: the request was refused (nothing done)."""

    request_id: int
    target: int = 0
    action: str = ""
    start: int = 0
    stop: list[str] = []
    closing: list[str] = []
    resumed: list[str] = []
    reason: str = ""
    error: str = ""
