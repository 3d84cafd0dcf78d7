"""The scheduler's records: tasks, their groups and prefixes, workers and clients.

Group and prefix counters are maintained inside the ``TaskState.state`` setter, so
every progress or dashboard query reads counters instead of scanning tasks.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from shoal.protocol.messages import Key, Payload

if TYPE_CHECKING:
    from shoal.core.scheduler.placement import Restrictions
    from shoal.core.scheduler.progress import ProgressWatch

TASK_STATES = ("released", "waiting", "queued", "processing", "memory", "erred", "forgotten")
FINISHED = frozenset(("memory", "erred", "forgotten"))  # what a progress watch waits for
UNKNOWN_DURATION = 0.5  # seconds assumed for a prefix with no measurement yet (as Dask)
# Heartbeats a worker record keeps for its dashboard page: ~1 min in a small cluster
# (a beat each 0.5 s), ~30 min at 1,000 workers; ~15 kB per worker.
WORKER_HISTORY = 120

_hex8 = re.compile(r"^[0-9a-f]{8}$")


def group_name(key: Any) -> str:
    """The TaskGroup name of a key (or of a group name given as a key): a tuple's first
    element, as text (Dask's convention)."""
    if type(key) is tuple:
        key = key[0] if key else ""
    return str(key)


def prefix_name(key: Any) -> str:
    """The TaskPrefix name of a key (or group name): its group's prefix."""
    return key_split(group_name(key))


def key_split(name: Any) -> str:
    """The prefix of a key or group name: ``"inc-1a2b3c4d"`` -> ``"inc"``,
    ``("x-9f0e1d2c", 0, 1)`` -> ``"x"`` (Dask's convention)."""
    if type(name) is tuple:
        name = name[0] if name else ""
    if type(name) is not str:
        return str(name)
    words = name.split("-")
    first = words[0]
    if first and not first[0].isalpha():
        first = first.split(",")[0].strip("_'()\" ")
    parts = [first]
    for word in words[1:]:
        if word.isalpha() and not (len(word) == 8 and _hex8.match(word)):
            parts.append(word)
        else:
            break
    return "-".join(parts)


class Counters:
    """Tasks per state, bytes in memory, and measured durations."""

    __slots__ = ("name", "states", "nbytes", "duration_sum", "duration_count", "alive")

    def __init__(self, name: str):
        self.name = name
        self.states: dict[str, int] = dict.fromkeys(TASK_STATES, 0)
        self.nbytes = 0
        self.duration_sum = 0.0
        self.duration_count = 0
        self.alive = 0  # tasks not yet forgotten

    def add_duration(self, seconds: float) -> None:
        self.duration_sum += seconds
        self.duration_count += 1

    @property
    def mean_duration(self) -> float:
        if self.duration_count:
            return self.duration_sum / self.duration_count
        return UNKNOWN_DURATION


class TaskPrefix(Counters):
    """All tasks whose keys share a prefix, e.g. every ``inc``."""

    __slots__ = ("groups", "totals", "entered", "recent_duration")

    def __init__(self, name: str, totals: dict[str, int] | None = None):
        super().__init__(name)
        # Its recent durations, halved in weight at each new one (Dask's duration
        # average): the first runs of a prefix (imports, warm caches) soon stop counting,
        # where the mean keeps them. None: never measured.
        self.recent_duration: float | None = None
        self.groups: dict[str, TaskGroup] = {}  # alive, oldest first
        # Transitions into each state, ever (Prometheus' prefix_state_totals counter).
        self.entered: dict[str, int] = dict.fromkeys(TASK_STATES, 0)
        # Tasks per state over the whole scheduler, shared by every prefix of it: kept
        # with the prefix's own counts, so the cluster summary never sums prefixes.
        self.totals = dict.fromkeys(TASK_STATES, 0) if totals is None else totals

    def add_duration(self, seconds: float) -> None:
        self.duration_sum += seconds  # as Counters.add_duration (no super() call per task)
        self.duration_count += 1
        recent = self.recent_duration
        self.recent_duration = seconds if recent is None else (recent + seconds) / 2

    @property
    def ngroups(self) -> int:
        return len(self.groups)


class TaskGroup(Counters):
    """The tasks of one operation, e.g. one ``client.map`` call or one dask layer."""

    __slots__ = ("prefix", "owner")

    def __init__(self, name: str, prefix: TaskPrefix):
        super().__init__(name)
        self.prefix = prefix
        self.owner: ClientRecord | None = None  # the client that first submitted to it


class ClientRecord:
    __slots__ = ("id", "wants", "partial", "watches", "forward_output")

    def __init__(self, client_id: str):
        self.id = client_id
        self.forward_output = True  # it gets its tasks' output (TaskOutput)
        self.wants: set[TaskState] = set()
        self.watches: dict[int, ProgressWatch] = {}  # its progress watches by id
        # The new tasks of a graph still arriving in parts: (those to wait, those to
        # err, with "erred"); None when no graph is half submitted.
        self.partial: tuple[list[TaskState], dict[TaskState, str]] | None = None

    def __repr__(self) -> str:
        return f"<Client {self.id}>"


class WorkerRecord:
    __slots__ = (
        "address",
        "name",
        "host",
        "nthreads",
        "memory_limit",
        "processing",
        "ahead",
        "long_running",
        "has_what",
        "nbytes",
        "occupancy",
        "known_functions",
        "tasks_run",
        "min_slots",
        "slot_threads",
        "draining",
        "ndraining",
        "aliases",
        "resources",
        "used_resources",
        "status",
        "pid",
        "memory",
        "spilled",
        "cpu",
        "net_in",
        "net_out",
        "memory_pause",
        "memory_terminate",
        "history",
        "last_seen",
        "pins",
        "deadline",
        "budget",
        "assigned",
        "http_address",
        "transferred_in",
        "transferred_out",
    )

    def __init__(
        self,
        address: str,
        name: str,
        nthreads: int,
        memory_limit: int,
        resources: Mapping[str, float] | None = None,
        pid: int = 0,
        now: float = 0.0,
        deadline: float | None = None,
        budget: int | None = None,
    ):
        self.address = address
        self.name = name or address
        self.host = parse_host(address)  # parsed once, here
        # What a restriction may call it: address (with or without "tcp://"), name, host.
        self.aliases = frozenset((address, address.split("://", 1)[-1], self.name, self.host))
        self.resources: dict[str, float] = dict(resources or {})  # totals, e.g. {"GPU": 2}
        self.used_resources = dict.fromkeys(self.resources, 0.0)  # held by processing tasks
        self.nthreads = nthreads
        self.memory_limit = memory_limit
        self.processing: set[TaskState] = set()
        # processing tasks sent ahead of dependencies still computing here: they hold
        # no thread slot until those finish (core/scheduler/ahead.py)
        self.ahead: set[TaskState] = set()
        # processing tasks that seceded: they run on but hold no thread slot here
        self.long_running: set[TaskState] = set()
        self.has_what: set[TaskState] = set()
        self.nbytes = 0
        self.occupancy = 0.0  # expected seconds of work assigned and not yet reported
        self.known_functions: set[str] = set()
        self.tasks_run = 0
        # Threads that may take tasks: nthreads less those still running a task that
        # was released while it ran (until the worker says that thread is free again:
        # ComputeReleased). Keys -> how many such threads run that key (a multiset: a
        # key may be cancelled, submitted again and cancelled again while it runs).
        self.draining: dict[Key, int] = {}
        self.ndraining = 0  # sum of draining's counts
        self.slot_threads = nthreads
        self.min_slots = min_slots(nthreads)
        # "running"; "paused" (its memory is full) and "retiring" get no new tasks.
        self.status = "running"
        self.pid = pid
        self.memory = 0  # process memory and spilled bytes at the last heartbeat
        self.spilled = 0
        # Telemetry of its last heartbeat (the dashboard's): CPU percent, host network
        # bytes/s, the memory fractions where it pauses and is restarted (None: off).
        self.cpu = 0.0
        self.net_in = 0.0
        self.net_out = 0.0
        self.memory_pause: float | None = None
        self.memory_terminate: float | None = None
        # Its recent heartbeats (monotonic time, memory, cpu, spilled), bounded.
        self.history: deque[tuple[float, int, float, int]] = deque(maxlen=WORKER_HISTORY)
        self.last_seen = now  # when it last sent anything (the server's clock)
        self.pins: set[int] = set()  # ids of the pins holding it (core/scheduler/pins.py)
        # Walltime (core/scheduler/walltime.py): when its lifetime ends, on the
        # scheduler's wall clock, and how many tasks it may be given in all; None: no
        # limit. ``assigned`` counts tasks given to it, only while it has a budget.
        self.deadline = deadline
        self.budget = budget
        self.assigned = 0
        self.http_address = ""  # its HTTP port (/metrics), as it said hello
        # dependency bytes it fetched from / sent to peers in all, at the last heartbeat
        self.transferred_in = 0
        self.transferred_out = 0

    def __repr__(self) -> str:
        return f"<Worker {self.address} processing={len(self.processing)}>"


def min_slots(threads: int) -> int:
    """Tasks a worker with ``threads`` free threads may always be given: a little more
    than one per thread, so that a thread never idles for a round trip to the scheduler
    (Dask's worker-saturation of 1.1); none when no thread is free."""
    return threads + max(1, threads // 10) if threads > 0 else 0


def parse_host(address: str) -> str:
    rest = address.split("://", 1)[-1]
    if rest.startswith("["):
        return rest[1 : rest.index("]")]
    return rest.rsplit(":", 1)[0]


_T = TypeVar("_T")

# A task's dependents, waiters, holders, ... are a tuple of distinct members while they
# are few, a set beyond SMALL: most have none or one, and a tuple costs 40 + 8 bytes per
# member where even an empty set costs 216. They change only through added/discarded.
SMALL = 8
Members = tuple[_T, ...] | set[_T]


def added(members: Members[_T], x: _T) -> Members[_T]:
    """``members`` with ``x`` in it: the same set, or a new tuple (a new set past SMALL)."""
    if not members:
        return (x,)
    if type(members) is set:
        members.add(x)
        return members
    if x in members:
        return members
    if len(members) < SMALL:
        return (*members, x)
    return {*members, x}


def discarded(members: Members[_T], x: _T) -> Members[_T]:
    """``members`` without ``x``: the same set, or a new tuple (once empty, ())."""
    if type(members) is set:
        members.discard(x)
        return members if members else ()
    if x not in members:
        return members
    if len(members) == 1:
        return ()
    assert type(members) is tuple
    i = members.index(x)  # (members are distinct, compared by identity)
    return members[:i] + members[i + 1 :]


class _FailureField(Generic[_T]):
    """A TaskState attribute kept in its rarely made ``_failure`` record: it reads as
    ``default`` while there is none, and setting the default makes none."""

    def __init__(self, field: str, default: _T):
        self.field = field
        self.default = default

    def __get__(self, ts: TaskState, owner: type | None = None) -> _T:
        failure = ts._failure
        return self.default if failure is None else getattr(failure, self.field)

    def __set__(self, ts: TaskState, value: _T) -> None:
        if value != self.default or ts._failure is not None:
            setattr(ts._failure_record(), self.field, value)


class TaskState:
    __slots__ = (
        "key",
        "_state",
        "group",
        "func",
        "payload",
        "dependencies",
        "dependents",
        "waiting_on",
        "waiters",
        "who_wants",
        "who_has",
        "processing_on",
        "rank",
        "nbytes",
        "estimate",
        "_failure",  # retries and the error: rare, so one slot (None) for all four
        "run_id",  # how many times it was sent to a worker: results name the assignment
        "type_name",
        "restrictions",
        "watches",
    )

    def __init__(
        self,
        key: Key,
        func: str | tuple[str, ...],
        payload: Payload | None,
        group: TaskGroup,
        rank: int = 0,
        retries: int = 0,
    ):
        self.key = key
        self._state = "released"
        self.group = group
        self.func = func
        self.payload = payload  # None: data with no way to recompute it (scattered)
        # Fixed once made (cut only to break a cycle): a tuple of one costs 48 bytes.
        self.dependencies: tuple[TaskState, ...] = ()
        self.dependents: Members[TaskState] = ()
        self.waiting_on: Members[TaskState] = ()  # dependencies not yet in memory
        self.waiters: Members[TaskState] = ()  # dependents that still need this result
        self.who_wants: Members[ClientRecord] = ()
        self.who_has: Members[WorkerRecord] = ()
        self.processing_on: WorkerRecord | None = None
        self.rank = rank  # the order it runs in, smaller first: see task_rank
        self.nbytes = 0
        self.estimate = 0.0  # the occupancy this task added to its worker
        self._failure: _Failure | None = _Failure(retries) if retries else None
        self.run_id = 0
        self.type_name = ""
        self.restrictions: Restrictions | None = None  # shared; None: any worker will do
        self.watches: Members[ProgressWatch] = ()  # progress watches waiting for it
        group.states["released"] += 1
        group.prefix.states["released"] += 1
        group.prefix.totals["released"] += 1
        group.prefix.entered["released"] += 1
        group.alive += 1
        group.prefix.alive += 1

    @property
    def state(self) -> str:
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        old = self._state
        group = self.group
        group.states[old] -= 1
        group.states[value] += 1
        prefix = group.prefix
        prefix.states[old] -= 1
        prefix.states[value] += 1
        prefix.entered[value] += 1
        totals = prefix.totals
        totals[old] -= 1
        totals[value] += 1
        self._state = value
        if self.watches and value in FINISHED:
            for watch in self.watches:
                watch.finished(self, value)
            self.watches = ()

    def __repr__(self) -> str:
        return f"<Task {self.key!r} {self._state}>"

    # Derived or rarely set: kept off the record (8 bytes a slot, and a record is
    # allocated in 16-byte steps), read and written as attributes all the same.

    @property
    def prefix(self) -> TaskPrefix:
        return self.group.prefix

    def _failure_record(self) -> _Failure:
        failure = self._failure
        if failure is None:
            failure = self._failure = _Failure(0)
        return failure

    retries = _FailureField[int]("retries", 0)
    exception = _FailureField["Payload | None"]("exception", None)
    traceback = _FailureField[str]("traceback", "")
    exception_blame = _FailureField["TaskState | None"]("blame", None)  # None: its own
    refused = _FailureField["Payload | None"]("refused", None)

    @property
    def priority(self) -> tuple[int, int, int]:
        """(-user priority, submission, index in it): the order workers are told."""
        return rank_priority(self.rank)

    def __lt__(self, other: TaskState) -> bool:  # heap tie-breaks; ranks are unique
        return self.rank < other.rank


class _Failure:
    """A task's retries left and its error, if it has either."""

    __slots__ = ("retries", "exception", "traceback", "blame", "refused")

    def __init__(self, retries: int):
        self.retries = retries
        self.exception: Payload | None = None
        self.traceback = ""
        self.blame: TaskState | None = None
        # Why the submission refused it (a dependency that exists nowhere, an unsent
        # function, a cycle): unlike ``exception``, kept when it is released, because
        # it can never run: its dependencies are incomplete.
        self.refused: Payload | None = None


# A task's order is one int, not a tuple of three (64 bytes less per task): the user's
# priority above the submission's number above the task's index in it, each field in
# its own bits, so that int order is the tuple's order.
_INDEX_BITS = 32
_SUBMISSION_BITS = 31  # the wire's int64 holds (submission << 32) | index
_USER_SHIFT = _INDEX_BITS + _SUBMISSION_BITS


def task_rank(user_priority: int, submission: int, index: int) -> int:
    """The rank of the ``index``-th task of the ``submission``-th graph part: higher
    user priority first, then earlier submissions, then earlier tasks in a part."""
    if not (0 <= index < 1 << _INDEX_BITS and 0 <= submission < 1 << _SUBMISSION_BITS):
        raise ValueError(f"task rank out of range: submission {submission}, index {index}")
    return (-user_priority << _USER_SHIFT) | (submission << _INDEX_BITS) | index


def rank_priority(rank: int) -> tuple[int, int, int]:
    """The (-user priority, submission, index) tuple ``rank`` was made from."""
    user = rank >> _USER_SHIFT
    rest = rank & ((1 << _USER_SHIFT) - 1)
    return (user, rest >> _INDEX_BITS, rest & ((1 << _INDEX_BITS) - 1))
