"""Wire messages: msgspec structs in one tagged union.

Every message is an array-like struct whose first element is its tag (the class
name), so a batch encodes compactly and decoding validates field types. Every
message that changes state carries a ``stimulus_id`` so any resulting state can be
traced back to what caused it.

User data never appears here as Python objects: it travels as :class:`Payload`
(opaque bytes plus a count of out-of-band buffers carried at the end of the frame).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

# 2: task restrictions and worker resources. An older peer would silently drop the new
# trailing fields (a GPU task run anywhere), so the handshake must refuse it instead.
# 3: heartbeats, worker status (paused), nanny reports, retirement, unserialisable results.
# 4: pushed cluster summaries, seceded tasks, progress watches, task group queries.
# 5: WorkerLeaving (a worker asks to be retired or removed: SIGTERM, a restart).
# 6: ReleaseCompute / ComputeReleased (a released task's thread counts busy until it
#    ends) and CancelKeys.force (interrupt running tasks).
# 7: a task erred because a dependency's data cannot be had names it (TaskErred.blamed);
#    keys are never NaN, nor hold None or bools (as Dask); results carry their run_id.
# 8: payload kind BYTES (a large bytes value as one out-of-band buffer); out-of-band
#    buffers are no longer bounded by the frame limit.
# 9: elastic clusters: pins and the event log (PinWorkers, EventsRequest, ...,
#    RetireWorkers.ignore_pins, WorkerInfo.pins), scaling (ScaleRequest, ScaleReply),
#    the P2P shuffle (TaskSpec.shuffle, ComputeTask.shuffle, Shuffle* messages),
#    MissingData.tried (a copy made during the fetch is not dropped as lost).
# 10: plugins (RegisterPlugin, UnregisterPlugin, PluginReply) and LogEvent; walltime:
#    Hello.lifetime and Hello.max_tasks (a worker's remaining lifetime and task budget),
#    TaskSpec.duration (a task's expected duration, a hint), WorkerInfo.lifetime_left and
#    tasks_left, TaskUnplaceable, WorkerLeaving.walltime.
# 11: more of Dask's Client (RunFunction, RunReply, FireAndForget, PublishDataset,
#    DatasetRequest, DatasetReply, RestartRequest, RetryKeys, ReplicateKeys); work
#    stealing (StealRequest, StealReply); task output forwarded to clients (TaskOutput,
#    ForwardOutput); ScaleRequest.replace_ahead;
#    coordination primitives (Coordinate, CoordinateReply: locks, semaphores, events,
#    variables, queues, publish/subscribe held by the scheduler); actors (RegisterActor,
#    ActorCall, ActorReply).
# 12: the task stream (TaskStreamRequest, TaskStreamReply, TaskStreamRecord).
# 13: metrics: Hello.http_address (a worker's HTTP port, /metrics), dependency bytes
#    moved (Heartbeat.transferred_in/out), both shown in WorkerInfo; the dashboard:
#    Welcome.dashboard_port, worker telemetry (Heartbeat/WorkerInfo cpu, net_in/out,
#    memory_pause/terminate; WorkerInfo.spilled); rebalance (RebalanceRequest,
#    RebalanceReply); has_what of every client (HasWhatRequest, HasWhatReply);
#    Coordinate.names (MultiLock) and .lease_timeout.
PROTOCOL_VERSION = 13

# A task key: a string, or a tuple like Dask's ("name", i, j). Tuple elements are
# typed (to a fixed nesting depth, as msgspec has no recursive aliases) so that nested
# tuples decode as tuples and every decoded key is hashable.
_KeyAtom = int | float | str
_KeyTuple3 = tuple[_KeyAtom, ...]
_KeyTuple2 = tuple[_KeyAtom | _KeyTuple3, ...]
_KeyTuple1 = tuple[_KeyAtom | _KeyTuple2, ...]
Key = str | int | float | _KeyTuple1  # Dask's keys: str, int, float, or tuples of them


def check_key(key: object) -> None:
    """Raise TypeError, naming the key, for one that cannot be a key: as Dask, a str,
    int or float, or a tuple of those (nested at most 3 deep, as the wire carries
    them); and, unlike Dask, never NaN, alone or inside a tuple: a key must equal
    itself, or no lookup would ever find its task (it would hold a thread forever)."""
    problem = key_problem(key)
    if problem is not None:
        raise TypeError(f"invalid key {key!r}: {problem}")


def key_problem(key: object) -> str | None:
    """Why ``key`` cannot be a task key, or None when it can."""
    t = type(key)
    if t is str or t is int:
        return None
    if t is float:
        return None if key == key else _NAN_KEY
    if t is tuple:
        return _tuple_key_problem(key, 3)  # type: ignore[arg-type]
    return _KEY_TYPES


_NAN_KEY = "NaN is not equal to itself, so no lookup could ever find the task"
_KEY_TYPES = "a key is a str, int or float, or a tuple of those (nested at most 3 deep), as in Dask"


def _tuple_key_problem(key: tuple, depth: int) -> str | None:
    for x in key:
        t = type(x)
        if t is str or t is int:
            continue
        if t is float:
            if x != x:
                return _NAN_KEY
        elif t is tuple:
            if depth == 1:
                return _KEY_TYPES
            problem = _tuple_key_problem(x, depth - 1)
            if problem is not None:
                return problem
        else:
            return _KEY_TYPES
    return None


def _check_decoded_key(key: Key) -> None:
    """Decoding refuses a key no lookup could find (a ValidationError: the connection
    that sent it closes, naming the key). Cheap for the usual str key."""
    if type(key) is not str:
        problem = key_problem(key)
        if problem is not None:
            raise ValueError(f"invalid key {key!r}: {problem}")


# An amount of a resource ("GPU": 1, "MEM": 10e9): decoding refuses negatives and NaN.
Amount = Annotated[float, msgspec.Meta(ge=0)]


def check_resources(resources: Mapping[Any, Any]) -> dict[str, float]:
    """``resources`` as the wire carries them (names to amounts), or ValueError saying
    what is wrong: the side that sends them should fail, not the connection."""
    out = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a resource needs a name, not {name!r}")
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            raise ValueError(f"resource {name!r} needs a number, not {amount!r}")
        if math.isnan(amount) or amount < 0:
            raise ValueError(f"resource {name!r} cannot be {amount!r}")
        out[name] = float(amount)
    return out


class Payload(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """A serialised user object. ``kind`` is MSGPACK, PICKLE or BYTES (serialize.py);
    ``nbuffers`` out-of-band buffers follow in the frame, in message order."""

    kind: int
    data: bytes
    nbuffers: Annotated[int, msgspec.Meta(ge=0)] = 0


class Message(msgspec.Struct, tag=True, array_like=True, gc=False, omit_defaults=True):
    """Base of every wire message."""


def _check_parallel(msg: Message, name: str, values: list[Any], what: str) -> None:
    """Lists that go pairwise with ``keys`` must be as long: zip would drop the rest
    silently. Raised while decoding, this is a ValidationError (a ProtocolError)."""
    keys = msg.keys  # type: ignore[attr-defined]
    if len(keys) != len(values):
        raise ValueError(
            f"{type(msg).__name__} has {len(keys)} keys but {len(values)} {what} ({name})"
        )


# --- handshake -------------------------------------------------------------------


class Hello(Message):
    """First message on every connection, from the side that connected."""

    version: int
    role: str  # "client" | "worker" | "peer"
    name: str = ""
    address: str = ""  # a worker's listening address
    nthreads: int = 0
    memory_limit: int = 0
    pid: int = 0
    subscribe: bool = True
    resources: dict[str, Amount] = {}  # a worker's totals, e.g. {"GPU": 2}
    # A worker's remaining lifetime in seconds (--lifetime, staggered) and task budget
    # (--max-tasks) when it says hello; None: unlimited. Relative, as clocks differ
    # between hosts: the scheduler turns the lifetime into a deadline on its own clock.
    lifetime: float | None = None
    max_tasks: int | None = None
    http_address: str = ""  # a worker's HTTP port (/metrics, /health), if it opened one


class Welcome(Message):
    version: int
    id: str  # the scheduler's (or worker's) identity
    assigned: str = ""  # client id or worker name as the server records it
    dashboard_port: int = 0  # the scheduler's dashboard (HTTP) port; 0: none


class Refused(Message):
    """Sent before closing a connection that broke the protocol."""

    reason: str


# --- client -> scheduler ---------------------------------------------------------


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
    shuffle: ShuffleMark | None = None  # a task of a P2P shuffle (see the P2P section)
    # Expected seconds it runs (``submit(duration=)``, ``dask.annotate(duration=)``):
    # not started on a worker whose remaining lifetime is shorter. None: measured.
    duration: float | None = None

    def __post_init__(self) -> None:
        _check_decoded_key(self.key)
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


class ScatterDone(Message):
    """Data the client placed on ``worker``: the scheduler records it as in memory."""

    keys: list[Key]
    nbytes: list[int]
    worker: str
    stimulus_id: str = ""

    def __post_init__(self) -> None:
        _check_parallel(self, "nbytes", self.nbytes, "sizes")
        for key in self.keys:
            _check_decoded_key(key)


class WhoHasRequest(Message):
    request_id: int
    keys: list[Key]


class InfoRequest(Message):
    """The scheduler's identity, its summary and a page of its workers (all of them by
    default: ``limit`` -1)."""

    request_id: int
    start: int = 0
    limit: int = -1


# --- scheduler -> client ---------------------------------------------------------


class KeyInMemory(Message):
    key: Key
    value: Payload | None = None  # small results ride along, saving a round trip
    type_name: str = ""
    stimulus_id: str = ""


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


class WhoHasReply(Message):
    request_id: int
    who_has: list[tuple[Key, list[str]]]


class WorkerInfo(msgspec.Struct, array_like=True, gc=False):
    address: str
    name: str
    host: str
    nthreads: int
    memory_limit: int
    processing: int
    nbytes: int
    tasks_run: int
    resources: dict[str, float] = {}
    pid: int = 0
    status: str = "running"  # "running" | "paused" | "retiring"
    memory: int = 0  # process memory at the last heartbeat
    pins: list[PinInfo] = []  # the pins holding it
    lifetime_left: float | None = None  # seconds to its deadline (None: no lifetime)
    tasks_left: int | None = None  # tasks it may still be given (None: no budget)
    http_address: str = ""  # its HTTP port, e.g. "http://10.0.0.5:40123" ("": none)
    transferred_in: int = 0  # bytes of dependencies it fetched from peers, in all
    transferred_out: int = 0  # bytes it sent to peers that fetched from it, in all
    # Telemetry from its last heartbeat, for the dashboard.
    spilled: int = 0  # bytes of results spilled to disk
    cpu: float = 0.0  # process CPU, percent of one core
    net_in: float = 0.0  # host network bytes/s received
    net_out: float = 0.0  # host network bytes/s sent
    memory_pause: float | None = None  # fractions of memory_limit (None: off)
    memory_terminate: float | None = None


class InfoReply(Message):
    request_id: int
    scheduler_id: str
    address: str
    workers: list[WorkerInfo]  # the page asked for
    tasks: int
    summary: ClusterState | None = None


class PrefixCounts(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """One task prefix's counters (e.g. every ``inc``): tasks per state, bytes held,
    and the durations measured."""

    name: str
    states: dict[str, int]
    nbytes: int = 0
    duration_sum: float = 0.0
    duration_count: int = 0


class GroupsRequest(Message):
    """Client -> scheduler: the counters of the newest ``limit`` task groups (of one
    prefix, if given): the answer costs O(limit), however many groups there are."""

    request_id: int
    prefix: str = ""
    limit: int = 100


class GroupsReply(Message):
    request_id: int
    groups: list[PrefixCounts]  # newest first
    total: int  # groups alive (of the prefix, if one was asked for)


class WatchProgress(Message):
    """Client -> scheduler: count, per prefix, the tasks these keys need until every
    one is done; the counts come back as :class:`ProgressCounts` when they change."""

    watch_id: int
    keys: list[Key]
    stimulus_id: str = ""


class StopProgress(Message):
    watch_id: int
    stimulus_id: str = ""


class PrefixProgress(msgspec.Struct, array_like=True, gc=False):
    name: str
    total: int
    memory: int  # done: reached memory (they count as done after being released)
    erred: int


class ProgressCounts(Message):
    """Scheduler -> the watching client, at most once an interval while they change."""

    watch_id: int
    prefixes: list[PrefixProgress]
    forgotten: int = 0  # tasks forgotten before they finished (cancelled, released)
    finished: bool = False  # nothing left to wait for: the last message of this watch


class ClusterState(Message):
    """Scheduler -> subscribed clients, when it changed (at most once an interval): the
    cluster in numbers kept up to date as events happen, never the list of workers."""

    version: int
    workers: int
    nthreads: int
    memory_limit: int
    nbytes: int  # results held by workers
    paused: int  # workers paused or retiring
    tasks: dict[str, int]  # per state
    prefixes: list[PrefixCounts] = []
    # A delta, pushed to subscribers: ``prefixes`` lists only those that changed since
    # the summary of version ``base`` (the previous push), ``removed`` those now gone.
    base: int = -1  # -1: a full summary
    removed: list[str] = []


# --- scheduler -> worker ---------------------------------------------------------


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


# --- worker -> scheduler ---------------------------------------------------------


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


class AddKeys(Message):
    """The worker now holds these keys (fetched replicas or scattered data)."""

    keys: list[Key]
    nbytes: list[int]
    stimulus_id: str = ""

    def __post_init__(self) -> None:
        _check_parallel(self, "nbytes", self.nbytes, "sizes")


class MissingData(Message):
    """``key`` could not run: ``missing`` were not found on any worker we were told of.
    ``tried[i]`` names the peers asked for ``missing[i]`` that did not deliver it: copies
    the scheduler learned of since are not lost (None: every copy is treated as lost)."""

    key: Key
    missing: list[Key]
    stimulus_id: str = ""
    tried: list[list[str]] | None = None


# --- peer to peer (worker <-> worker, client -> worker) ---------------------------


class GetData(Message):
    request_id: int
    keys: list[Key]


class DataReply(Message):
    request_id: int
    keys: list[Key]
    payloads: list[Payload]
    missing: list[Key] = []
    failed: list[tuple[Key, str]] = []  # held, but could not be serialised: why

    def __post_init__(self) -> None:
        _check_parallel(self, "payloads", self.payloads, "payloads")


class UpdateData(Message):
    request_id: int
    keys: list[Key]
    payloads: list[Payload]

    def __post_init__(self) -> None:
        _check_parallel(self, "payloads", self.payloads, "payloads")


class Ack(Message):
    request_id: int
    nbytes: list[int] = []


# ---------------------------------------------------------------- liveness and faults


class Heartbeat(Message):
    """Worker or client -> scheduler, every ``interval`` seconds: I am alive. A worker
    adds its process memory, its spilled bytes and how many tasks it is running."""

    request_id: int
    memory: int = 0
    spilled: int = 0
    executing: int = 0
    # A worker's totals of dependency bytes fetched from / sent to peers since it started.
    transferred_in: int = 0
    transferred_out: int = 0
    # For the dashboard: process CPU (percent of one core), the host's network bytes/s
    # in and out since the previous beat, and the memory fractions at which it pauses
    # and its nanny restarts it (None: off).
    cpu: float = 0.0
    net_in: float = 0.0
    net_out: float = 0.0
    memory_pause: float | None = None
    memory_terminate: float | None = None


class HeartbeatReply(Message):
    """Scheduler -> sender: the scheduler is alive too, and when to beat next (the
    interval grows with the size of the cluster)."""

    request_id: int
    interval: float


class WorkerStatus(Message):
    """Worker -> scheduler: "paused" (memory over the pause fraction: start nothing new,
    assign it nothing new) or "running" again."""

    status: str
    stimulus_id: str = ""


class WorkerExited(Message):
    """Nanny -> scheduler: the worker it supervises exited (or was killed)."""

    address: str
    name: str
    reason: str
    restarting: bool = False
    stimulus_id: str = ""


class WorkerLeaving(Message):
    """Worker -> scheduler: this worker is going away on its own (SIGTERM, a restart it
    wants). ``retire``: copy the results only it holds to other workers first; else
    remove it at once. Either way its running tasks go elsewhere, nothing counts as a
    failure, and the scheduler answers ``CloseWorker`` once it is done with it."""

    reason: str
    retire: bool = True
    stimulus_id: str = ""
    # Its lifetime or task budget is over: while no other worker can take its results,
    # it waits (given no task, still a home for others' results) instead of losing them.
    walltime: bool = False


class KeyUnserializable(Message):
    """Worker -> scheduler: the result of ``key`` could not be pickled (to send it or to
    spill it). The scheduler errs the task with ``reason``; the worker has dropped it."""

    key: Key
    reason: str
    stimulus_id: str = ""


class RetireWorkers(Message):
    """Client -> scheduler: retire these workers (addresses or names) gracefully.
    A pinned worker is refused unless ``ignore_pins`` (then it leaves its pins)."""

    request_id: int
    workers: list[str]
    close: bool = True
    ignore_pins: bool = False


class RetireReply(Message):
    request_id: int
    retired: list[str]
    refused: dict[str, str] = {}  # worker -> why it was kept


class CopyKeys(Message):
    """Scheduler -> worker: fetch replicas of these keys from their holders and keep
    them (used to move data off a retiring worker)."""

    deps: list[DepInfo]
    stimulus_id: str = ""


class CloseWorker(Message):
    """Scheduler -> worker: close now (after retirement); the nanny does not restart it."""

    reason: str
    stimulus_id: str = ""


# --- P2P shuffle (shoal/shuffle) ----------------------------------------------------


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


# --- pins and the event log (issue 12) ----------------------------------------------


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


class TaskStreamRecord(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """One finished execution of a task (see ``core/scheduler/task_stream.py``).
    ``start``/``stop`` are the worker's wall clock (seconds since the epoch)."""

    key: Key
    prefix: str
    group: str
    worker: str
    start: float
    stop: float
    status: str  # "memory" or "erred"
    nbytes: int = 0


class TaskStreamRequest(Message):
    """Client -> scheduler: the task stream records after ``cursor`` (0: all kept), at
    most ``limit`` of them (the newest)."""

    request_id: int
    cursor: int = 0
    limit: int | None = None


class TaskStreamReply(Message):
    request_id: int
    cursor: int  # to ask from next time
    records: list[TaskStreamRecord] = []


class EventsRequest(Message):
    """Client -> scheduler: the structured events of ``topic``, or of every topic."""

    request_id: int
    topic: str | None = None


class EventsReply(Message):
    request_id: int
    events: dict[str, list[tuple[float, dict[str, Any]]]]  # topic -> (timestamp, data)


# ---------------------------------------------------------------- coordination primitives


class Coordinate(Message):
    """Client -> scheduler: one operation ``op`` on the primitive ``kind`` called
    ``name`` (see ``shoal/core/scheduler/coordination.py``). ``value`` is opaque
    pickled bytes, or ``key`` names a future whose data the primitive keeps alive.
    ``number``: a semaphore's max_leases, a queue's maxsize, a get's batch size (0: one
    item, -1: all there are). ``timeout``: seconds to wait (None: no limit, 0: do not
    wait). ``token``: a lease, subscription or MultiLock request id chosen by the
    client. ``lease_timeout``: seconds a lease lives without a refresh. Answered by
    CoordinateReply, possibly much later (a blocked acquire or get)."""

    request_id: int
    kind: str
    name: str
    op: str
    value: bytes | None = None
    key: Key | None = None
    number: int = 0
    timeout: float | None = None
    token: str = ""
    stimulus_id: str = ""
    names: list[str] = []  # a MultiLock's lock names
    lease_timeout: float | None = None  # a semaphore's or lock's (None: leases never expire)


class CoordinateReply(Message):
    request_id: int
    ok: bool = True  # False: not acquired / not released / event not set / timed out
    value: bytes | None = None
    key: Key | None = None
    items: list[tuple[bytes | None, Key | None]] = []  # a batch get
    number: int = 0  # a count: leases held, queue size, subscribers reached
    timed_out: bool = False
    error: str = ""  # the request was refused: why


class RegisterActor(Message):
    """Client -> scheduler: these submitted keys are actors. While one is in memory its
    worker is pinned (owner ``actor:<key>``): it cannot be retired or scaled down."""

    keys: list[Key]
    stimulus_id: str = ""


class ActorCall(Message):
    """Client -> the worker holding actor ``key``: call its method ``name`` with the
    pickled ``(args, kwargs)`` (``op`` "call"), or read its attribute ``name`` ("getattr").
    Answered by ActorReply."""

    request_id: int
    key: Key
    op: str
    name: str
    args: bytes | None = None


class ActorReply(Message):
    request_id: int
    value: bytes | None = None  # the pickled result
    error: bytes | None = None  # the pickled exception it raised
    no_actor: bool = False  # this worker holds no actor of that key


# ---------------------------------------------------------------- scaling: scale and adapt
# A cluster (LocalCluster, a job-queue cluster) asks the scheduler what to do; the
# scheduler decides (the adaptive policy and which workers to close are in the core).

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


# ---------------------------------------------------------------- plugins (shoal/plugins/)
# The one place a server unpickles what a client sent: a scheduler plugin. Worker and
# nanny plugins pass through the scheduler as opaque bytes.


class RegisterPlugin(Message):
    """Client -> scheduler (``kind`` "scheduler", "worker" or "nanny"); scheduler ->
    worker or nanny (request_id 0: one that joined later, no answer wanted)."""

    request_id: int
    kind: str
    name: str
    plugin: bytes  # pickled by the client; unpickled only by the processes it is for
    idempotent: bool = False


class UnregisterPlugin(Message):
    request_id: int
    name: str
    kind: str = ""  # "": whichever kind has a plugin of that name


class PluginResult(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    status: str  # "OK" or "error"
    error: str = ""  # "TypeName: message"
    traceback: str = ""


class PluginReply(Message):
    """What each process said (by worker address, nanny name, or "scheduler"), or
    ``error`` when the request was refused as a whole (``error_type`` names the
    exception the client raises: "ValueError", "PermissionError")."""

    request_id: int
    kind: str = ""
    results: dict[str, PluginResult] = {}
    error: str = ""
    error_type: str = ""


class LogEvent(Message):
    """Worker or nanny -> scheduler: record ``data`` in the event log under ``topic``."""

    topic: str
    data: dict[str, Any]
    stimulus_id: str = ""


class RunFunction(Message):
    """Client -> worker (``client.run``) or scheduler (``client.run_on_scheduler``):
    call a function there, outside the task graph. The scheduler unpickles it only
    from a client that proved the cluster token (as it does plugins)."""

    request_id: int
    call: bytes  # cloudpickled (function, args, kwargs)


class RunReply(Message):
    """The answer to :class:`RunFunction`: ``status`` "OK" (``result`` is the pickled
    return value) or "error" (``result`` the pickled exception, ``error`` its text);
    ``error_type`` "PermissionError" when the request was refused as a whole."""

    request_id: int
    status: str
    result: bytes = b""
    error: str = ""
    error_type: str = ""


class FireAndForget(Message):
    """Client -> scheduler: compute these keys even if every client releases them; the
    scheduler lets them go once each is done (``shoal.fire_and_forget``)."""

    keys: list[Key]
    stimulus_id: str = ""


class PublishDataset(Message):
    """Client -> scheduler: keep ``keys`` under ``name`` with ``data`` (the published
    object, pickled with its futures as references to ``keys``)."""

    request_id: int
    name: str
    keys: list[Key]
    data: bytes
    override: bool = False


class DatasetRequest(Message):
    """Client -> scheduler: ``op`` "get", "unpublish" (the dataset ``name``) or "list"."""

    request_id: int
    op: str
    name: str = ""


class DatasetReply(Message):
    """The answer to :class:`PublishDataset` / :class:`DatasetRequest`; ``error`` when
    refused (no such dataset, a name already taken)."""

    request_id: int
    names: list[str] = []
    keys: list[Key] = []
    data: bytes = b""
    error: str = ""


class RestartRequest(Message):
    """Client -> scheduler (``client.restart``): cancel every client's futures and drop
    datasets and fire-and-forget keys; answered with :class:`Ack` (the client then has
    the workers restart through their nannies)."""

    request_id: int
    stimulus_id: str = ""


class RetryKeys(Message):
    """Client -> scheduler (``Future.retry``, ``client.retry``): run these erred keys
    again, and the erred dependencies they failed through."""

    keys: list[Key]
    stimulus_id: str = ""


class ReplicateKeys(Message):
    """Client -> scheduler (``client.replicate``): have ``n`` workers (-1: all) among
    ``workers`` (names or addresses; empty: all) hold each key in memory."""

    keys: list[Key]
    n: int = -1
    workers: list[str] = []
    stimulus_id: str = ""


class RebalanceRequest(Message):
    """Client -> scheduler (``client.rebalance``): move keys in memory (``keys``; None:
    every key) between ``workers`` (names or addresses; empty: all) so that their
    managed bytes even out; answered with :class:`RebalanceReply` once every move is
    over (a copy confirmed and the source dropped, or given up). See
    ``shoal/core/scheduler/rebalance.py`` for the thresholds."""

    request_id: int
    keys: list[Key] | None = None
    workers: list[str] = []
    stimulus_id: str = ""
    # Dask's thresholds, fractions of each worker's memory limit (the client's config)
    sender_min: float = 0.3
    recipient_max: float = 0.6
    sender_recipient_gap: float = 0.1

    def __post_init__(self) -> None:
        for name in ("sender_min", "recipient_max", "sender_recipient_gap"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"RebalanceRequest.{name} must be a fraction in [0, 1]: {value}")


class RebalanceReply(Message):
    """Scheduler -> client: ``moved`` keys now live on their recipients only (of the
    two); ``abandoned`` moves did not happen (copy failed or too slow, a worker left,
    the key was released) and left the key where it was."""

    request_id: int
    moved: int
    abandoned: int


class HasWhatRequest(Message):
    """Client -> scheduler (``client.has_what``): a page of the keys in memory on one
    worker (name or address), every client's; ``limit`` keys from ``start``."""

    request_id: int
    worker: str
    start: int = 0
    limit: int = 100_000


class HasWhatReply(Message):
    """The page asked for; ``total`` keys the worker holds now (pages are read from a
    live set: a key that moves between two pages may be missed or seen twice)."""

    request_id: int
    address: str  # "" when no such worker is connected
    keys: list[Key]
    total: int


AnyMessage = (
    Hello
    | Welcome
    | Refused
    | SubmitTasks
    | ReleaseKeys
    | CancelKeys
    | WantKeys
    | ScatterDone
    | WhoHasRequest
    | InfoRequest
    | KeyInMemory
    | KeyErred
    | KeyCancelled
    | TaskUnplaceable
    | WhoHasReply
    | InfoReply
    | FunctionDefs
    | ComputeTask
    | FreeKeys
    | ReleaseCompute
    | ComputeReleased
    | StealRequest
    | StealReply
    | TaskOutput
    | ForwardOutput
    | TaskFinished
    | TaskSeceded
    | TaskErred
    | AddKeys
    | MissingData
    | GetData
    | DataReply
    | UpdateData
    | Ack
    | Heartbeat
    | HeartbeatReply
    | WorkerStatus
    | WorkerExited
    | WorkerLeaving
    | KeyUnserializable
    | RetireWorkers
    | RetireReply
    | CopyKeys
    | CloseWorker
    | ClusterState
    | GroupsRequest
    | GroupsReply
    | WatchProgress
    | StopProgress
    | ProgressCounts
    | ShuffleData
    | ShuffleRestart
    | ShuffleForget
    | ShuffleStats
    | PinWorkers
    | ReleasePin
    | RenewPin
    | PinReply
    | EventsRequest
    | EventsReply
    | TaskStreamRequest
    | TaskStreamReply
    | ScaleRequest
    | ScaleReply
    | RegisterPlugin
    | UnregisterPlugin
    | PluginReply
    | LogEvent
    | RunFunction
    | RunReply
    | FireAndForget
    | PublishDataset
    | DatasetRequest
    | DatasetReply
    | RestartRequest
    | RetryKeys
    | ReplicateKeys
    | RebalanceRequest
    | RebalanceReply
    | HasWhatRequest
    | HasWhatReply
    | Coordinate
    | CoordinateReply
    | RegisterActor
    | ActorCall
    | ActorReply
)

ALL_MESSAGES: tuple[type[Message], ...] = AnyMessage.__args__
