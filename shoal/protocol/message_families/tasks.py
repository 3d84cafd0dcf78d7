"""Tasks and results: a graph submitted, tasks sent to workers to run, their
results and errors reported back, keys released, cancelled, retried or stolen.
"""

from __future__ import annotations

import msgspec

from shoal.protocol.message_families.base import (
    Amount,
    Key,
    Message,
    Payload,
    check_decoded_key,
)
from shoal.protocol.message_families.elastic import ShuffleMark, ShuffleRun

# --- client -> scheduler -------------------------------------------------------------


class TaskRestrictions(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """Where a task may run: ``Client.submit(workers=, allow_other_workers=, resources=)``."""

    workers: list[str] = []  # worker addresses, names or hosts; empty: any worker
    allow_other_workers: bool = False  # ``workers`` is a preference, not a requirement
    resources: dict[str, Amount] = {}  # held on the worker while the task runs


class TaskSpec(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    key: Key
    func: str  # function table id; "" for a task that only holds data
    payload: Payload  # (args, kwargs) with dependency references
    deps: list[Key] = []
    group: str = ""  # TaskGroup name; derived from the key when empty
    priority: int = 0  # user priority: higher runs first
    retries: int = 0
    funcs: list[str] = []  # function-table ids used inside the payload (besides ``func``)
    # One optional field rather than three: msgspec writes every field of an array-like
    # struct, defaults too (omit_defaults only trims maps), so this costs an unrestricted
    # task one byte (nil) instead of three.
    restrictions: TaskRestrictions | None = None
    shuffle: ShuffleMark | None = None  # a task of a P2P shuffle (see elastic.py)
    # Expected seconds it runs (``submit(duration=)``, ``dask.annotate(duration=)``):
    # not started on a worker whose remaining lifetime is shorter. None: measured.
    duration: float | None = None

    def __post_init__(self) -> None:
        check_decoded_key(self.key)
        if self.duration is not None and not (self.duration >= 0 and self.duration < 1e300):
            raise msgspec.ValidationError(f"invalid task duration {self.duration!r}")


class SubmitTasks(Message):
    tasks: list[TaskSpec]
    wanted: list[Key]  # keys the client holds futures for
    functions: dict[str, bytes] = {}  # function table entries new to this connection
    stimulus_id: str = ""
    # More parts of the same graph follow (dependencies first): nothing is scheduled
    # until the last part, so a large graph never has to be one frame.
    more: bool = False


class ReleaseKeys(Message):
    keys: list[Key]
    stimulus_id: str = ""


class CancelKeys(Message):
    keys: list[Key]
    stimulus_id: str = ""
    # Interrupt the tasks this cancel releases while they run (an exception raised in
    # their threads; the worker is restarted if one does not stop within a grace period).
    force: bool = False


class WantKeys(Message):
    """A client holds futures for keys it did not submit (e.g. unpickled futures)."""

    keys: list[Key]
    stimulus_id: str = ""


# --- scheduler -> client -------------------------------------------------------------


class KeyInMemory(Message):
    key: Key
    value: Payload | None = None  # small results ride along, saving a round trip
    type_name: str = ""
    stimulus_id: str = ""
    # The workers holding it when this was sent (a hint: the client fetches from them
    # without asking WhoHas first; a holder that no longer has it answers "missing").
    who_has: list[str] = []


class KeyErred(Message):
    key: Key
    exception: Payload
    traceback: str
    blamed: Key | None = None  # the task that actually failed, if not this one
    stimulus_id: str = ""


class KeyCancelled(Message):
    key: Key
    reason: str = ""
    stimulus_id: str = ""


class TaskUnplaceable(Message):
    """Scheduler -> clients that want ``key`` (or all, if none does): it fits no
    connected worker's remaining lifetime or task budget, and waits for one that it
    fits (a fresh worker). Sent once per episode of a prefix's tasks waiting so."""

    key: Key
    prefix: str
    duration: float  # the seconds it is expected to run
    longest_left: float | None  # the most seconds any worker has left (None: no worker)
    reason: str
    stimulus_id: str = ""


# --- scheduler -> worker -------------------------------------------------------------


class DepInfo(msgspec.Struct, array_like=True, gc=False):
    key: Key
    nbytes: int
    who_has: list[str]


class FunctionDefs(Message):
    """Function table entries, sent once per connection before first use."""

    functions: dict[str, bytes]


class ComputeTask(Message):
    key: Key
    func: str
    payload: Payload
    priority: tuple[int, ...]
    deps: list[DepInfo] = []
    stimulus_id: str = ""
    resources: dict[str, Amount] = {}  # what the task holds while it runs here
    # Which assignment of the key this is (1, 2, ... per task). The worker's answer
    # carries it, so that the scheduler can tell an answer to an earlier assignment,
    # released since, from the current one.
    run_id: int = 0
    shuffle: ShuffleRun | None = None  # the P2P shuffle run this task belongs to
    # A client wants the result: the worker sends it inline with TaskFinished when its
    # serialised form is small (shoal.worker.inline-results-bytes), pickled or not.
    client_wants: bool = False


class FreeKeys(Message):
    keys: list[Key]
    stimulus_id: str = ""


class ReleaseCompute(Message):
    """Scheduler -> worker: ``key`` is no longer to be computed here (it was processing
    here and was released: cancelled, or no longer needed). The worker drops it as for
    FreeKeys. With ``drain``, the scheduler counts one of this worker's threads busy
    until the worker answers :class:`ComputeReleased` for it, exactly once: at once if
    no thread counted here runs the task, else when that thread ends or secedes, or when
    a ComputeTask for the key takes the running execution over again. With
    ``interrupt``, a thread still running the task is interrupted (``force=True``)."""

    key: Key
    drain: bool = True
    interrupt: bool = False
    stimulus_id: str = ""


class StealRequest(Message):
    """Scheduler -> worker: give back ``key`` (its assignment ``run_id``) if it has not
    started, to run it on an idle worker. Answered by :class:`StealReply`."""

    key: Key
    run_id: int
    stimulus_id: str = ""


# --- worker -> scheduler -------------------------------------------------------------


class TaskFinished(Message):
    key: Key
    nbytes: int
    start: float
    stop: float
    value: Payload | None = None
    type_name: str = ""
    stimulus_id: str = ""
    run_id: int = 0  # the ComputeTask's; 0: not said (the scheduler then cannot tell)


class TaskSeceded(Message):
    """The task runs on but waits on other tasks (it seceded): the scheduler stops
    counting it against the worker's threads, so that the tasks it waits on can run."""

    key: Key
    stimulus_id: str = ""


class ComputeReleased(Message):
    """Worker -> scheduler: the answer to a ReleaseCompute with ``drain``: that execution
    of ``key`` holds none of this worker's threads any more."""

    key: Key
    stimulus_id: str = ""


class TaskOutput(Message):
    """Worker -> scheduler -> client: what the task ``key`` printed, logged and warned
    since the last such message (see ``shoal/server/output.py``). ``data`` is opaque to
    the scheduler (msgpack of entries, read by ``shoal/client/output.py``); it fills in
    ``worker`` (the worker's address) as it forwards the message to the task's client."""

    key: Key
    worker: str
    data: bytes


class ForwardOutput(Message):
    """Client -> scheduler: whether this client gets the output of its tasks
    (:class:`TaskOutput`); on by default (``Client(forward_output=False)``)."""

    enabled: bool


class StealReply(Message):
    """Worker -> scheduler: the answer to a StealRequest. ``ok``: the task had not
    started and was dropped here (it will not run here); else "too late": it runs, or
    ran, here and its result is reported as usual."""

    key: Key
    run_id: int
    ok: bool
    stimulus_id: str = ""


class TaskErred(Message):
    key: Key
    exception: Payload
    traceback: str
    start: float = 0.0
    stop: float = 0.0
    stimulus_id: str = ""
    blamed: Key | None = None  # the dependency whose data could not be had, if that failed
    run_id: int = 0  # the ComputeTask's


class KeyUnserializable(Message):
    """Worker -> scheduler: the result of ``key`` could not be pickled (to send it or to
    spill it). The scheduler errs the task with ``reason``; the worker has dropped it."""

    key: Key
    reason: str
    stimulus_id: str = ""


# --- client -> scheduler -------------------------------------------------------------


class FireAndForget(Message):
    """Client -> scheduler: compute these keys even if every client releases them; the
    scheduler lets them go once each is done (``shoal.fire_and_forget``)."""

    keys: list[Key]
    stimulus_id: str = ""


class RetryKeys(Message):
    """Client -> scheduler (``Future.retry``, ``client.retry``): run these erred keys
    again, and the erred dependencies they failed through."""

    keys: list[Key]
    stimulus_id: str = ""
