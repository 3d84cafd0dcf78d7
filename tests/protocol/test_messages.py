"""Wire messages: every message type round-trips; keys keep their types; bad input is
refused with ProtocolError."""

from __future__ import annotations

import math
import struct

import msgspec
import pytest

from shoal.protocol import messages as m
from shoal.protocol.framing import FrameDecoder, ProtocolError, encode_frame

PAYLOAD = m.Payload(kind=1, data=b"\x80\x05payload", nbuffers=2)
SMALL = m.Payload(kind=0, data=b"\x01")

# One representative instance per message type, with *every* field set to a value
# other than its default, so that each field actually travels on the wire.
SAMPLES: dict[type[m.Message], m.Message] = {
    m.Hello: m.Hello(
        version=m.PROTOCOL_VERSION,
        role="worker",
        name="w-1",
        address="tcp://10.0.0.1:4000",
        nthreads=8,
        memory_limit=2**34,
        pid=4242,
        subscribe=False,
        resources={"GPU": 2.0, "MEM": 10e9},
        lifetime=3300.0,
        max_tasks=5,
        http_address="http://10.0.0.1:4001",
    ),
    m.Welcome: m.Welcome(
        version=m.PROTOCOL_VERSION, id="scheduler-1", assigned="client-7", dashboard_port=8787
    ),
    m.Refused: m.Refused(reason="protocol version mismatch: 1 != 2"),
    m.SubmitTasks: m.SubmitTasks(
        tasks=[
            m.TaskSpec(
                key=("inc", 0),
                func="f" * 24,
                payload=PAYLOAD,
                deps=["a", 1, ("x", 2, 3)],
                group="inc-abc",
                priority=-3,
                retries=2,
                funcs=["g" * 24],
                restrictions=m.TaskRestrictions(
                    workers=["tcp://w:1", "gpu-host"],
                    allow_other_workers=True,
                    resources={"GPU": 1.0},
                ),
                shuffle=m.ShuffleMark("abc", "transfer", 0),
                duration=14400.0,
            ),
            m.TaskSpec(key="data", func="", payload=SMALL),
            # a layer template's task: msgpack [template id, slots], the template a
            # function-table entry named in funcs (protocol 15)
            m.TaskSpec(
                key=("fused", 1),
                func="h" * 24,
                payload=m.Payload(3, b"\x92\xb8" + b"t" * 24 + b"\x92\xa1a\x01"),
                funcs=["t" * 24],
            ),
        ],
        wanted=[("inc", 0)],
        functions={"f" * 24: b"\x80\x05function", "g" * 24: b"\x80\x05g"},
        stimulus_id="submit-1",
        more=True,
    ),
    m.ReleaseKeys: m.ReleaseKeys(keys=["a", ("b", 1)], stimulus_id="release-1"),
    m.CancelKeys: m.CancelKeys(keys=[3, "c"], stimulus_id="cancel-1", force=True),
    m.WantKeys: m.WantKeys(keys=[("d", 0, 0)], stimulus_id="want-1"),
    m.ScatterDone: m.ScatterDone(
        keys=["s1", ("s", 2)], nbytes=[10, 20], worker="tcp://w:1", stimulus_id="scatter-1"
    ),
    m.WhoHasRequest: m.WhoHasRequest(request_id=5, keys=["a", ("b", 1)]),
    m.InfoRequest: m.InfoRequest(request_id=6, start=10, limit=100),
    m.KeyInMemory: m.KeyInMemory(
        key=("x", 1),
        value=SMALL,
        type_name="int",
        stimulus_id="task-finished-1",
        who_has=["tcp://w:1", "tcp://w:2"],
    ),
    m.KeyErred: m.KeyErred(
        key="y",
        exception=PAYLOAD,
        traceback="Traceback (most recent call last): ...",
        blamed=("z", 0),
        stimulus_id="task-erred-1",
    ),
    m.KeyCancelled: m.KeyCancelled(key=7, reason="client cancelled", stimulus_id="cancel-2"),
    m.TaskUnplaceable: m.TaskUnplaceable(
        key=("long", 0),
        prefix="long",
        duration=14400.0,
        longest_left=3600.0,
        reason="fits no worker's remaining lifetime",
        stimulus_id="unplaceable-1",
    ),
    m.WhoHasReply: m.WhoHasReply(
        request_id=5, who_has=[("a", ["tcp://w:1", "tcp://w:2"]), (("b", 1), [])]
    ),
    m.InfoReply: m.InfoReply(
        request_id=6,
        scheduler_id="scheduler-1",
        address="tcp://s:8786",
        workers=[
            m.WorkerInfo(
                address="tcp://w:1",
                name="w-1",
                host="w",
                nthreads=4,
                memory_limit=2**33,
                processing=3,
                nbytes=1024,
                tasks_run=99,
                resources={"GPU": 2.0},
                pins=[m.PinInfo(3, "shuffle", "client:client-1-x", expires=1.7e9)],
                lifetime_left=120.5,
                tasks_left=3,
                http_address="http://w:8788",
                transferred_in=2048,
                transferred_out=4096,
                spilled=2048,
                cpu=87.5,
                net_in=1.5e6,
                net_out=2.5e5,
                memory_pause=0.8,
                memory_terminate=0.95,
            )
        ],
        tasks=12,
        summary=m.ClusterState(
            version=1,
            workers=1,
            nthreads=4,
            memory_limit=2**33,
            nbytes=1024,
            paused=0,
            tasks={"memory": 12},
        ),
    ),
    m.FunctionDefs: m.FunctionDefs(functions={"a" * 24: b"one", "b" * 24: b"two"}),
    m.ComputeTask: m.ComputeTask(
        key=("inc", 1),
        func="f" * 24,
        payload=PAYLOAD,
        priority=(0, -1, 42),
        deps=[m.DepInfo(key=("inc", 0), nbytes=28, who_has=["tcp://w:2"])],
        stimulus_id="compute-1",
        resources={"GPU": 0.5},
        run_id=3,
        shuffle=m.ShuffleRun("abc", 2, ["tcp://w:1", "tcp://w:2"]),
        client_wants=True,
    ),
    m.FreeKeys: m.FreeKeys(keys=["a", 2, ("c", 3)], stimulus_id="free-1"),
    m.ReleaseCompute: m.ReleaseCompute("a", False, True, stimulus_id="cancel-1"),
    m.ComputeReleased: m.ComputeReleased(("b", 1), stimulus_id="thread-ended-1"),
    m.StealRequest: m.StealRequest(("c", 2), 3, stimulus_id="balance-1"),
    m.StealReply: m.StealReply(("c", 2), 3, False, stimulus_id="steal-1"),
    m.TaskOutput: m.TaskOutput(("c", 2), "tcp://127.0.0.1:9", b"\x91\x92\xa6stdout\xa2hi"),
    m.ForwardOutput: m.ForwardOutput(False),
    m.TaskFinished: m.TaskFinished(
        key=("inc", 1),
        nbytes=28,
        start=1.5,
        stop=2.25,
        value=SMALL,
        type_name="int",
        stimulus_id="finished-1",
        run_id=3,
    ),
    m.TaskSeceded: m.TaskSeceded(key=("parent", 1), stimulus_id="secede-1"),
    m.TaskErred: m.TaskErred(
        key="bad",
        exception=PAYLOAD,
        traceback="ZeroDivisionError",
        start=1.0,
        stop=1.5,
        stimulus_id="erred-1",
        blamed=("dep", 0),
        run_id=2,
    ),
    m.AddKeys: m.AddKeys(keys=["r1", ("r", 2)], nbytes=[8, 16], stimulus_id="add-1"),
    m.MissingData: m.MissingData(
        key="t", missing=["u", ("v", 1)], stimulus_id="missing-1", tried=[["tcp://a:1"], []]
    ),
    m.GetData: m.GetData(request_id=9, keys=["a", ("b", 1)], host="boot/1/2/0"),
    m.DataReply: m.DataReply(
        request_id=9,
        keys=["a"],
        payloads=[PAYLOAD],
        missing=[("b", 1)],
        failed=[("c", "why")],
        lease=4,
        lender=1234,
        lent=[(4096, 10), (8192, 20)],
    ),
    m.ReturnLease: m.ReturnLease(request_id=12, lease=3),
    m.LeaseReturned: m.LeaseReturned(request_id=12, held=True),
    m.UpdateData: m.UpdateData(request_id=10, keys=["a", 1], payloads=[SMALL, PAYLOAD]),
    m.Ack: m.Ack(request_id=10, nbytes=[1, 2]),
    m.Heartbeat: m.Heartbeat(
        request_id=11,
        memory=2**31,
        spilled=1024,
        executing=3,
        transferred_in=10,
        transferred_out=20,
        cpu=150.0,
        net_in=3e6,
        net_out=1e3,
        memory_pause=0.8,
        memory_terminate=0.95,
    ),
    m.HeartbeatReply: m.HeartbeatReply(request_id=11, interval=0.5),
    m.WorkerStatus: m.WorkerStatus(status="paused", stimulus_id="s-12"),
    m.WorkerExited: m.WorkerExited(
        address="tcp://127.0.0.1:4000",
        name="0",
        reason="killed by signal 9",
        restarting=True,
        stimulus_id="s-16",
    ),
    m.WorkerLeaving: m.WorkerLeaving(
        reason="received SIGTERM", retire=False, stimulus_id="s-18", walltime=True
    ),
    m.KeyUnserializable: m.KeyUnserializable(
        key=("x", 1), reason="cannot pickle lock", stimulus_id="s-17"
    ),
    m.RetireWorkers: m.RetireWorkers(
        request_id=13, workers=["0", "tcp://127.0.0.1:4001"], close=False, ignore_pins=True
    ),
    m.RetireReply: m.RetireReply(
        request_id=13, retired=["tcp://127.0.0.1:4001"], refused={"0": "no other worker"}
    ),
    m.CopyKeys: m.CopyKeys(
        deps=[m.DepInfo(key="a", nbytes=8, who_has=["tcp://127.0.0.1:4001"])], stimulus_id="s-14"
    ),
    m.CloseWorker: m.CloseWorker(reason="retired", stimulus_id="s-15"),
    m.ClusterState: m.ClusterState(
        version=18,
        workers=2,
        nthreads=8,
        memory_limit=2**34,
        nbytes=1024,
        paused=1,
        tasks={"memory": 3, "processing": 2},
        prefixes=[
            m.PrefixCounts("inc", {"memory": 3}, nbytes=24, duration_sum=0.5, duration_count=3)
        ],
        base=17,
        removed=["dec"],
    ),
    m.GroupsRequest: m.GroupsRequest(request_id=19, prefix="inc", limit=10),
    m.GroupsReply: m.GroupsReply(
        request_id=19,
        groups=[m.PrefixCounts("inc-1a2b3c4d", {"processing": 1}, duration_count=2)],
        total=7,
    ),
    m.WatchProgress: m.WatchProgress(watch_id=3, keys=["a", ("b", 1)], stimulus_id="p-3"),
    m.StopProgress: m.StopProgress(watch_id=3, stimulus_id="p-3-stop"),
    m.ProgressCounts: m.ProgressCounts(
        watch_id=3,
        prefixes=[m.PrefixProgress("inc", total=10, memory=7, erred=1)],
        forgotten=1,
        finished=True,
    ),
    m.PinWorkers: m.PinWorkers(
        request_id=20,
        workers=["tcp://127.0.0.1:4001", "w-1"],
        reason="state",
        lease=2.5,
        stimulus_id="pin-20",
    ),
    m.ReleasePin: m.ReleasePin(request_id=21, pin_id=4, stimulus_id="unpin-4"),
    m.RenewPin: m.RenewPin(request_id=22, pin_id=4, stimulus_id="renew-4"),
    m.PinReply: m.PinReply(
        request_id=20,
        pin_id=4,
        workers=["tcp://127.0.0.1:4001"],
        expires=1.7e9,
        done=False,
        error="cannot pin 'x': no such worker",
    ),
    m.EventsRequest: m.EventsRequest(request_id=23, topic="pins"),
    m.TaskStreamRequest: m.TaskStreamRequest(request_id=24, cursor=7, limit=100),
    m.TaskStreamReply: m.TaskStreamReply(
        request_id=24,
        cursor=8,
        records=[
            m.TaskStreamRecord(
                ("inc-ab", 3), "inc", "inc-ab", "tcp://10.0.0.2:4000", 1.5, 2.0, "memory", 28
            )
        ],
    ),
    m.Coordinate: m.Coordinate(
        request_id=40,
        kind="queue",
        name="jobs",
        op="put",
        value=b"\x80\x05K\x01.",
        key=("inc", 3),
        number=2,
        timeout=1.5,
        token="lease-1",
        stimulus_id="coordinate-40",
        names=["a", "b"],
        lease_timeout=30.0,
    ),
    m.RegisterActor: m.RegisterActor(keys=["Counter-1", ("A", 2)], stimulus_id="actor-1"),
    m.ActorCall: m.ActorCall(
        request_id=41, key="Counter-1", op="call", name="increment", args=b"\x80\x05."
    ),
    m.ActorReply: m.ActorReply(request_id=41, value=b"\x80\x05K\x01.", error=b"e", no_actor=True),
    m.LaneRequest: m.LaneRequest(request_id=42),
    m.LaneGrant: m.LaneGrant(
        request_id=42, lane="lane-3", worker="tcp://w:1", reason="no running worker"
    ),
    m.LaneOpen: m.LaneOpen(lane="lane-3", client="client-7"),
    m.LaneClosed: m.LaneClosed(lane="lane-3", reason="worker tcp://w:1 left", gone=True),
    m.LaneRun: m.LaneRun(
        request_id=43,
        lane="lane-3",
        task=m.TaskSpec(key=("sum", 1), func="f" * 24, payload=SMALL, funcs=["g" * 24]),
        functions={"f" * 24: b"\x80\x05function"},
    ),
    # (every field set, so "declined": the one status that allows all of them)
    m.LaneResult: m.LaneResult(
        request_id=43,
        status="declined",
        payloads=[PAYLOAD],
        type_name="int",
        exception=SMALL,
        traceback="Traceback ...",
        reason="worker tcp://w:1 is busy",
        output=b"\x91\x92\xa6stdout\xa2hi",
        too_long=True,
    ),
    m.LaneRunGraph: m.LaneRunGraph(
        request_id=44,
        lane="lane-3",
        tasks=[
            m.TaskSpec(key=("ones", 0), func="f" * 24, payload=SMALL),
            m.TaskSpec(key="sum-1", func="g" * 24, payload=SMALL, deps=[("ones", 0)]),
        ],
        keys=["sum-1", ("ones", 0)],
        functions={"f" * 24: b"\x80\x05function"},
    ),
    m.LaneDurations: m.LaneDurations(durations={"ones": 0.0125, "sum": 2.5e-05}),
    m.LaneBusy: m.LaneBusy(lane="lane-3", key=("sum", 1)),
    m.LaneRan: m.LaneRan(
        lane="lane-3", key=("sum", 1), status="erred", start=1.5, stop=2.0, nbytes=28
    ),
    m.CoordinateReply: m.CoordinateReply(
        request_id=40,
        ok=False,
        value=b"\x80\x05K\x01.",
        key="inc-1",
        items=[(b"\x80\x05K\x02.", None), (None, ("x", 0))],
        number=2,
        timed_out=True,
        error="a queue has no operation 'pop'",
    ),
    m.ShuffleData: m.ShuffleData(
        request_id=24,
        id="abc",
        run=2,
        input_partition=5,
        partitions=[0, 2],
        counts=[10, 3],
        payloads=[m.Payload(1, b"\x80\x05rows", 0)],
    ),
    m.ShuffleRestart: m.ShuffleRestart(id="abc", run=3, stimulus_id="remove-w-1"),
    m.ShuffleForget: m.ShuffleForget(id="abc", run=3, stimulus_id="done-1"),
    m.ShuffleStats: m.ShuffleStats(id="abc", run=3, sent=1024, spilled=512, stimulus_id="s-1"),
    m.EventsReply: m.EventsReply(
        request_id=23,
        events={"pins": [(1.7e9, {"action": "pin", "pin": 4, "workers": ["tcp://w:1"]})]},
    ),
    m.ScaleRequest: m.ScaleRequest(
        request_id=24,
        workers=["0", "1"],
        n=4,
        session="adaptive-1",
        minimum=1,
        maximum=4,
        target_duration=1.5,
        wait_count=2,
        default_task_duration=0.1,
        threads_per_worker=2,
        replace_ahead=12.5,
    ),
    m.ScaleReply: m.ScaleReply(
        request_id=24,
        target=3,
        action="up",
        start=1,
        stop=["4"],
        closing=["2"],
        resumed=["1"],
        reason="up: 10 tasks",
        error="minimum (3) must not exceed maximum (2)",
    ),
    m.RegisterPlugin: m.RegisterPlugin(
        request_id=25, kind="worker", name="budget", plugin=b"\x80\x05.", idempotent=True
    ),
    m.UnregisterPlugin: m.UnregisterPlugin(request_id=26, name="budget", kind="nanny"),
    m.PluginReply: m.PluginReply(
        request_id=25,
        kind="worker",
        results={
            "tcp://127.0.0.1:4": m.PluginResult("OK"),
            "tcp://127.0.0.1:5": m.PluginResult("error", "ValueError: no", "Traceback ..."),
        },
        error="no plugin named 'x' is registered",
        error_type="ValueError",
    ),
    m.LogEvent: m.LogEvent("plugins", {"plugin": "budget", "hook": "setup"}, "plugin-1"),
    m.RunFunction: m.RunFunction(request_id=27, call=b"\x80\x05."),
    m.RunReply: m.RunReply(
        request_id=27,
        status="error",
        result=b"\x80\x05.",
        error="ZeroDivisionError: division by zero",
        error_type="PermissionError",
    ),
    m.FireAndForget: m.FireAndForget(["x-1", ("y", 0)], "fire-1"),
    m.PublishDataset: m.PublishDataset(
        request_id=28, name="ds", keys=["x-1"], data=b"\x80\x05.", override=True
    ),
    m.DatasetRequest: m.DatasetRequest(request_id=29, op="get", name="ds"),
    m.RestartRequest: m.RestartRequest(request_id=30, stimulus_id="restart-1"),
    m.RetryKeys: m.RetryKeys(["x-1", ("y", 0)], "retry-1"),
    m.ReplicateKeys: m.ReplicateKeys(["x-1"], n=2, workers=["w-1"], stimulus_id="replicate-1"),
    m.RebalanceRequest: m.RebalanceRequest(
        request_id=31,
        keys=["x-1", ("y", 0)],
        workers=["w-1"],
        stimulus_id="rebalance-1",
        sender_min=0.2,
        recipient_max=0.5,
        sender_recipient_gap=0.05,
    ),
    m.RebalanceReply: m.RebalanceReply(request_id=31, moved=3, abandoned=1),
    m.HasWhatRequest: m.HasWhatRequest(request_id=32, worker="w-1", start=10, limit=5),
    m.HasWhatReply: m.HasWhatReply(
        request_id=32, address="tcp://127.0.0.1:1", keys=["x-1", ("y", 0)], total=12
    ),
    m.DatasetReply: m.DatasetReply(
        request_id=29, names=["ds"], keys=[("y", 0)], data=b"\x80\x05.", error="no dataset"
    ),
}


def roundtrip(messages: list[m.Message], buffers=()) -> list[m.Message]:
    decoder = FrameDecoder()
    frames = decoder.feed(b"".join(bytes(piece) for piece in encode_frame(messages, buffers)))
    assert len(frames) == 1
    assert decoder.buffered == 0
    return frames[0].messages


def raw_frame(body: bytes) -> bytes:
    """A frame around an arbitrary (possibly invalid) msgpack body (layout: magic, u16
    buffer count, u32 body length, network byte order)."""
    return struct.pack("!2sHI", b"SH", 0, len(body)) + body


def decode_raw(batch: object) -> list[m.Message]:
    frames = FrameDecoder().feed(raw_frame(msgspec.msgpack.encode(batch)))
    assert len(frames) == 1
    return frames[0].messages


def test_every_message_type_has_a_sample():
    # Adding a message type without a sample here must fail this test.
    assert set(SAMPLES) == set(m.ALL_MESSAGES)
    assert len(m.ALL_MESSAGES) == len(set(m.ALL_MESSAGES))
    for cls, msg in SAMPLES.items():
        assert type(msg) is cls


@pytest.mark.parametrize("cls", m.ALL_MESSAGES, ids=lambda c: c.__name__)
def test_samples_set_every_field(cls):
    """Each sample exercises every field: none is left at its default."""
    msg = SAMPLES[cls]
    for field in msgspec.structs.fields(cls):
        if field.required:
            continue
        default = field.default_factory() if field.default is msgspec.NODEFAULT else field.default
        assert getattr(msg, field.name) != default, f"{cls.__name__}.{field.name} is default"


@pytest.mark.parametrize("cls", m.ALL_MESSAGES, ids=lambda c: c.__name__)
def test_message_roundtrip(cls):
    msg = SAMPLES[cls]
    [back] = roundtrip([msg])
    assert type(back) is cls
    assert back == msg


@pytest.mark.parametrize("cls", m.ALL_MESSAGES, ids=lambda c: c.__name__)
def test_message_roundtrip_with_defaults(cls):
    """The same message with only its required fields (defaults omitted on the wire)."""
    full = SAMPLES[cls]
    required = {f.name: getattr(full, f.name) for f in msgspec.structs.fields(cls) if f.required}
    msg = cls(**required)
    [back] = roundtrip([msg])
    assert back == msg


def test_batch_of_all_messages_keeps_order():
    batch = list(SAMPLES.values()) * 2
    assert roundtrip(batch) == batch


def test_empty_batch():
    assert roundtrip([]) == []


def test_message_is_tagged_with_its_class_name():
    body = msgspec.msgpack.decode(msgspec.msgpack.encode([m.InfoRequest(request_id=3)]))
    assert body == [["InfoRequest", 3, 0, -1]]


# --- keys -----------------------------------------------------------------------------

KEYS = [
    "x",
    "",
    "inc-0123456789abcdef",
    0,
    -5,
    2**63 - 1,
    ("x",),
    (),
    ("x", 1, 2),
    ("x", -1, 2.5, "s"),
    ("outer", ("inner", 1)),
    ("a", ("b", ("c", 1))),
]


def assert_same_key(a, b):
    """Equal, and of the same type all the way down (a tuple stays a tuple)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_key(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_key_roundtrip_keeps_type(key):
    msg = m.KeyErred(key=key, exception=SMALL, traceback="", blamed=key)
    back, free = roundtrip([msg, m.FreeKeys(keys=[key, key])])
    assert isinstance(back, m.KeyErred) and isinstance(free, m.FreeKeys)
    assert_same_key(back.key, key)
    assert_same_key(back.blamed, key)
    for k in free.keys:
        assert_same_key(k, key)
    hash(back.key)  # usable as a dict key by the scheduler


def test_keys_in_lists_and_nested_structs_keep_types():
    msg = SAMPLES[m.SubmitTasks]
    [back] = roundtrip([msg])
    assert isinstance(msg, m.SubmitTasks) and isinstance(back, m.SubmitTasks)
    for got, want in zip(back.tasks, msg.tasks):
        assert_same_key(got.key, want.key)
        for g, w in zip(got.deps, want.deps):
            assert_same_key(g, w)
    [reply] = roundtrip([SAMPLES[m.WhoHasReply]])
    assert isinstance(reply, m.WhoHasReply)
    assert_same_key(reply.who_has[1][0], ("b", 1))


@pytest.mark.parametrize(
    "bad_key",
    [
        ["a", {"not": "hashable"}],  # a map inside a tuple key
        ["a", ["b", ["c", ["d", 1]]]],  # nested deeper than keys may be
        None,
        b"bytes",
        ["a", None],  # Dask refuses None, bools and bytes inside tuple keys too
        ["a", True],
        ["a", ["b", False]],
    ],
    ids=repr,
)
def test_invalid_key_is_refused(bad_key):
    with pytest.raises(ProtocolError):
        decode_raw([["FreeKeys", [bad_key]]])
    with pytest.raises(TypeError, match="invalid key"):  # caught before sending, too
        m.check_key(tuple(bad_key) if isinstance(bad_key, list) else bad_key)


@pytest.mark.parametrize("key", [math.nan, ("x", math.nan), ("x", 1, ("y", (math.nan,)))], ids=repr)
def test_nan_keys_are_refused(key):
    """NaN never equals itself: a task under such a key could never be found again (it
    held a thread forever). Refused when building a task, and when decoding one."""
    with pytest.raises(TypeError, match="NaN is not equal to itself"):
        m.check_key(key)
    raw = [["SubmitTasks", [[key, "f", [0, b"\x92\x90\x80", 0]]], [], {}, "s"]]
    with pytest.raises(ProtocolError, match="NaN is not equal to itself"):
        decode_raw(raw)
    with pytest.raises(ProtocolError, match="NaN is not equal to itself"):
        decode_raw([["ScatterDone", [key], [8], "tcp://w:1", "s"]])


@pytest.mark.parametrize("key", [1.5, 2, "s", ("x", 1.5, (2, ("y", 3)))], ids=repr)
def test_dask_keys_are_keys(key):
    m.check_key(key)
    [msg] = roundtrip([m.FreeKeys([key])])
    assert isinstance(msg, m.FreeKeys)
    assert_same_key(msg.keys[0], key)


# --- validation -------------------------------------------------------------------------


def test_raw_batch_decodes():
    [msg] = decode_raw([["Ack", 3, [1, 2]]])
    assert msg == m.Ack(request_id=3, nbytes=[1, 2])


@pytest.mark.parametrize(
    "batch, expected",
    [
        ([["Ack", "three"]], "Expected `int`, got `str`"),
        ([["Hello", 1, 2]], "Expected `str`, got `int`"),
        ([["Refused"]], "Expected `array` of at least length 2"),
        ([["FreeKeys", "a"]], "Expected `array`, got `str`"),
        ([["FunctionDefs", {"id": "not bytes"}]], "Expected `bytes`, got `str`"),
        # a wrong type deep inside a nested struct: TaskSpec.payload.kind
        ([["SubmitTasks", [["k", "", ["zero", b""]]], []]], "Expected `int`, got `str`"),
    ],
)
def test_wrong_field_type_is_refused_naming_the_problem(batch, expected):
    with pytest.raises(ProtocolError, match="invalid message") as info:
        decode_raw(batch)
    assert expected in str(info.value)
    assert "$[0]" in str(info.value)  # and where: the first message of the batch


@pytest.mark.parametrize("amount", [-1.0, float("nan")])
def test_negative_or_nan_resource_amounts_are_refused(amount):
    restrictions = m.TaskRestrictions(resources={"GPU": amount})
    submit = m.SubmitTasks([m.TaskSpec("k", "", SMALL, restrictions=restrictions)], [])
    hello = m.Hello(m.PROTOCOL_VERSION, "worker", resources={"GPU": amount})
    for msg in (submit, hello):
        with pytest.raises(ProtocolError, match="Expected `float` >= 0.0"):
            decode_raw([msgspec.msgpack.decode(msgspec.msgpack.encode(msg))])


def test_an_unrestricted_task_pays_one_byte_for_restrictions():
    plain = m.TaskSpec("k", "", SMALL)
    encoded = msgspec.msgpack.encode(plain)
    # the nil of its one restrictions field, nothing more
    assert encoded.endswith(b"\xc0")
    assert len(encoded) == len(msgspec.msgpack.encode(msgspec.structs.astuple(plain)[:-1])) + 1


@pytest.mark.parametrize("duration", [-1.0, float("nan"), float("inf")])
def test_negative_or_nan_task_durations_are_refused(duration):
    raw = msgspec.structs.astuple(m.TaskSpec("k", "", SMALL))[:-1] + (duration,)
    with pytest.raises(ProtocolError, match="invalid task duration"):
        decode_raw([["SubmitTasks", [raw], []]])


def test_a_finished_lane_result_carries_a_value_per_key_and_at_least_one():
    two = m.LaneResult(1, "finished", payloads=[SMALL, PAYLOAD])  # a graph's two keys
    assert decode_raw([msgspec.msgpack.decode(msgspec.msgpack.encode(two))]) == [two]
    with pytest.raises(ProtocolError, match="a finished lane result with no value"):
        decode_raw([["LaneResult", 1, "finished"]])
    with pytest.raises(ProtocolError, match="unknown lane result status 'done'"):
        decode_raw([["LaneResult", 1, "done"]])


def test_bad_message_anywhere_in_batch_is_refused():
    with pytest.raises(ProtocolError) as info:
        decode_raw([["Ack", 1], ["Ack", 2], ["Ack", None]])
    assert "$[2]" in str(info.value)


def test_unknown_tag_is_refused():
    with pytest.raises(ProtocolError) as info:
        decode_raw([["Ack", 1], ["NoSuchMessage", 1]])
    assert "NoSuchMessage" in str(info.value)


@pytest.mark.parametrize(
    "tag", ["Payload", "TaskSpec", "TaskRestrictions", "WorkerInfo", "DepInfo", "Message"]
)
def test_non_message_structs_are_not_tags(tag):
    with pytest.raises(ProtocolError):
        decode_raw([[tag, 1]])


@pytest.mark.parametrize(
    "body",
    [
        msgspec.msgpack.encode({"Ack": 1}),  # not a batch
        msgspec.msgpack.encode(["Ack", 1]),  # a message, not a batch of messages
        msgspec.msgpack.encode([{"type": "Ack", "request_id": 1}]),  # not array-like
        b"",
        b"\xc1",  # a byte msgpack never uses
        msgspec.msgpack.encode([["Ack", 1]])[:-1],  # cut short
        msgspec.msgpack.encode([["Ack", 1]]) + b"\x00",  # trailing bytes
    ],
)
def test_malformed_body_is_refused(body):
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(raw_frame(body))


def test_protocol_version():
    assert type(m.PROTOCOL_VERSION) is int
    assert m.PROTOCOL_VERSION >= 1
