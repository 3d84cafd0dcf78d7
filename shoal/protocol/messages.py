"""Wire messages: msgspec structs in one tagged union.

Every message is an array-like struct whose first element is its tag (the class
name), so a batch encodes compactly and decoding validates field types. Every
message that changes state carries a ``stimulus_id`` so any resulting state can be
traced back to what caused it.

User data never appears here as Python objects: it travels as :class:`Payload`
(opaque bytes plus a count of out-of-band buffers carried at the end of the frame).

The messages are defined one module per family in ``shoal/protocol/message_families/``
(handshake, tasks, data, queries, membership, elastic, plugins, coordination; keys,
:class:`Payload` and :class:`Message` in ``base``). This module is where everyone
imports them from: it gathers them into the one tagged union (:data:`AnyMessage`,
whose order is :data:`ALL_MESSAGES`) and holds the protocol's version.
"""

from __future__ import annotations

from shoal.protocol.message_families.base import (
    Amount,
    Key,
    Message,
    Payload,
    check_key,
    check_resources,
    key_problem,
)
from shoal.protocol.message_families.coordination import (
    ActorCall,
    ActorReply,
    Coordinate,
    CoordinateReply,
    RegisterActor,
)
from shoal.protocol.message_families.data import (
    Ack,
    AddKeys,
    CopyKeys,
    DataReply,
    GetData,
    LeaseReturned,
    MissingData,
    RebalanceReply,
    RebalanceRequest,
    ReplicateKeys,
    ReturnLease,
    ScatterDone,
    UpdateData,
)
from shoal.protocol.message_families.elastic import (
    Count,
    PinInfo,
    PinReply,
    PinWorkers,
    ReleasePin,
    RenewPin,
    ScaleReply,
    ScaleRequest,
    ShuffleData,
    ShuffleForget,
    ShuffleMark,
    ShuffleRestart,
    ShuffleRun,
    ShuffleStats,
)
from shoal.protocol.message_families.handshake import (
    Hello,
    Refused,
    Welcome,
)
from shoal.protocol.message_families.lanes import (
    LaneBusy,
    LaneClosed,
    LaneDurations,
    LaneGrant,
    LaneOpen,
    LaneRan,
    LaneRequest,
    LaneResult,
    LaneRun,
    LaneRunGraph,
)
from shoal.protocol.message_families.membership import (
    CloseWorker,
    Heartbeat,
    HeartbeatReply,
    RestartRequest,
    RetireReply,
    RetireWorkers,
    WorkerExited,
    WorkerLeaving,
    WorkerStatus,
)
from shoal.protocol.message_families.plugins import (
    DatasetReply,
    DatasetRequest,
    LogEvent,
    PluginReply,
    PluginResult,
    PublishDataset,
    RegisterPlugin,
    RunFunction,
    RunReply,
    UnregisterPlugin,
)
from shoal.protocol.message_families.queries import (
    ClusterState,
    EventsReply,
    EventsRequest,
    GroupsReply,
    GroupsRequest,
    HasWhatReply,
    HasWhatRequest,
    InfoReply,
    InfoRequest,
    PrefixCounts,
    PrefixProgress,
    ProgressCounts,
    StopProgress,
    TaskStreamRecord,
    TaskStreamReply,
    TaskStreamRequest,
    WatchProgress,
    WhoHasReply,
    WhoHasRequest,
    WorkerInfo,
)
from shoal.protocol.message_families.tasks import (
    CancelKeys,
    ComputeReleased,
    ComputeTask,
    DepInfo,
    FireAndForget,
    ForwardOutput,
    FreeKeys,
    FunctionDefs,
    KeyCancelled,
    KeyErred,
    KeyInMemory,
    KeyUnserializable,
    ReleaseCompute,
    ReleaseKeys,
    RetryKeys,
    StealReply,
    StealRequest,
    SubmitTasks,
    TaskErred,
    TaskFinished,
    TaskOutput,
    TaskRestrictions,
    TaskSeceded,
    TaskSpec,
    TaskUnplaceable,
    WantKeys,
)

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
# 14: same-host transfers: GetData.host, DataReply.lease/lender/lent, ReturnLease,
#    LeaseReturned.
# 15: task-argument payloads: msgpack extension types (tuples, numpy scalars and
#    dtypes) and the TEMPLATE kind (a function-table template plus slot values).
# 16: results inline: ComputeTask.client_wants (the worker inlines a small result of a
#    key a client wants), KeyInMemory.who_has (the client fetches without WhoHas).
# 17: lanes (LaneRequest, LaneGrant, LaneOpen, LaneClosed, LaneRun, LaneResult,
#    LaneRan, LaneBusy): a one-task get sent by the client to a worker the scheduler
#    granted it.
# 18: small graphs by lane (LaneRunGraph, LaneDurations, LaneResult.too_long; a
#    finished LaneResult carries one value per key asked for).
PROTOCOL_VERSION = 18

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
    | ReturnLease
    | LeaseReturned
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
    | LaneRequest
    | LaneGrant
    | LaneOpen
    | LaneClosed
    | LaneRun
    | LaneResult
    | LaneRan
    | LaneBusy
    | LaneRunGraph
    | LaneDurations
)

ALL_MESSAGES: tuple[type[Message], ...] = AnyMessage.__args__

__all__ = [
    "ALL_MESSAGES",
    "Ack",
    "ActorCall",
    "ActorReply",
    "AddKeys",
    "Amount",
    "AnyMessage",
    "CancelKeys",
    "CloseWorker",
    "ClusterState",
    "ComputeReleased",
    "ComputeTask",
    "Coordinate",
    "CoordinateReply",
    "CopyKeys",
    "Count",
    "DataReply",
    "DatasetReply",
    "DatasetRequest",
    "DepInfo",
    "EventsReply",
    "EventsRequest",
    "FireAndForget",
    "ForwardOutput",
    "FreeKeys",
    "FunctionDefs",
    "GetData",
    "LeaseReturned",
    "GroupsReply",
    "GroupsRequest",
    "HasWhatReply",
    "HasWhatRequest",
    "Heartbeat",
    "HeartbeatReply",
    "Hello",
    "InfoReply",
    "InfoRequest",
    "Key",
    "KeyCancelled",
    "KeyErred",
    "KeyInMemory",
    "KeyUnserializable",
    "LaneBusy",
    "LaneClosed",
    "LaneDurations",
    "LaneGrant",
    "LaneOpen",
    "LaneRan",
    "LaneRequest",
    "LaneResult",
    "LaneRun",
    "LaneRunGraph",
    "LogEvent",
    "Message",
    "MissingData",
    "PROTOCOL_VERSION",
    "Payload",
    "PinInfo",
    "PinReply",
    "PinWorkers",
    "PluginReply",
    "PluginResult",
    "PrefixCounts",
    "PrefixProgress",
    "ProgressCounts",
    "PublishDataset",
    "RebalanceReply",
    "RebalanceRequest",
    "Refused",
    "RegisterActor",
    "RegisterPlugin",
    "ReleaseCompute",
    "ReleaseKeys",
    "ReleasePin",
    "RenewPin",
    "ReplicateKeys",
    "ReturnLease",
    "RestartRequest",
    "RetireReply",
    "RetireWorkers",
    "RetryKeys",
    "RunFunction",
    "RunReply",
    "ScaleReply",
    "ScaleRequest",
    "ScatterDone",
    "ShuffleData",
    "ShuffleForget",
    "ShuffleMark",
    "ShuffleRestart",
    "ShuffleRun",
    "ShuffleStats",
    "StealReply",
    "StealRequest",
    "StopProgress",
    "SubmitTasks",
    "TaskErred",
    "TaskFinished",
    "TaskOutput",
    "TaskRestrictions",
    "TaskSeceded",
    "TaskSpec",
    "TaskStreamRecord",
    "TaskStreamReply",
    "TaskStreamRequest",
    "TaskUnplaceable",
    "UnregisterPlugin",
    "UpdateData",
    "WantKeys",
    "WatchProgress",
    "Welcome",
    "WhoHasReply",
    "WhoHasRequest",
    "WorkerExited",
    "WorkerInfo",
    "WorkerLeaving",
    "WorkerStatus",
    "check_key",
    "check_resources",
    "key_problem",
]
