"""Dependencies whose data cannot be had for good (the holder cannot pickle it, this
worker cannot unpickle it, it is larger than this worker's memory limit): the worker
state machine, driven with events only. Nothing ever stands in for the data: it is
not stored, not reported to the scheduler as held, and not reported missing (which
would have it recomputed and fail again without end); the tasks that need it err."""

from __future__ import annotations

import pickle
from typing import Any

from test_worker_state import ARGS, ME, compute, dep, gathered, make, ok, run

from shoal.core.worker.state import (
    Execute,
    GatherDep,
    GatherSuccess,
    SendMessage,
    TransferError,
)
from shoal.protocol.messages import AddKeys, ComputeTask, FreeKeys, MissingData, Payload, TaskErred

A, B = "tcp://a:1", "tcp://b:1"
BOOM = TransferError("tcp://a:1 cannot pickle it: lock", Payload(1, b"the exception"))


def sent(instructions: list[Any]) -> list[Any]:
    return [inst.msg for inst in instructions if isinstance(inst, SendMessage)]


def failed_gather(worker: str, sid: str = "g", **failed: TransferError) -> GatherSuccess:
    return GatherSuccess(worker, {}, {}, [], sid, failed=failed)


def test_unsendable_dependency_errs_its_dependent_blamed_on_it():
    ws = make()
    out = run(ws, compute("y", dep("x", A)))
    assert [type(i) for i in out] == [GatherDep]
    out = run(ws, failed_gather(A, x=BOOM))
    [msg] = sent(out)
    assert isinstance(msg, TaskErred)
    assert (msg.key, msg.blamed, msg.exception) == ("y", "x", BOOM.exception)
    assert not any(isinstance(m, AddKeys | MissingData) for m in sent(out))
    assert "x" not in ws.data and "x" not in ws.tasks  # forgotten, never stood in for
    assert ws.tasks["y"].state == "error"
    # the scheduler errs y (or runs it again): the worker follows
    run(ws, FreeKeys(["y"], "free"))
    assert ws.tasks == {}


def test_every_dependent_errs_and_their_other_transfers_are_dropped():
    ws = make(nthreads=2)
    run(ws, compute("y1", dep("x", A), dep("z", B)), compute("y2", dep("x", A)))
    assert ws.tasks["z"].state == "flight" and ws.tasks["x"].state == "flight"
    out = run(ws, failed_gather(A, x=BOOM))
    erred = sorted(m.key for m in sent(out) if isinstance(m, TaskErred))
    assert erred == ["y1", "y2"]
    assert ws.tasks["z"].state == "cancelled"  # in flight: dropped once it arrives
    out = run(ws, gathered(B, "g2", z=3))
    assert sent(out) == [] and "z" not in ws.tasks


def test_a_transfer_failing_while_cancelled_is_forgotten_silently():
    ws = make()
    run(ws, compute("y", dep("x", A)), FreeKeys(["y"], "free"))
    assert ws.tasks["x"].state == "cancelled"
    out = run(ws, failed_gather(A, x=BOOM))
    assert sent(out) == [] and ws.tasks == {}


def test_asked_to_compute_the_key_meanwhile_it_computes_it():
    ws = make()
    run(ws, compute("y", dep("x", A)))
    run(ws, ComputeTask("x", "func", ARGS, (0,), [], "compute-x"))  # the scheduler moved it
    out = run(ws, failed_gather(A, x=BOOM))
    assert Execute("x", "g") in out
    assert not any(isinstance(m, TaskErred) for m in sent(out))
    out = run(ws, ok("x"))
    assert any(isinstance(i, Execute) and i.key == "y" for i in out)


def test_only_the_failed_keys_of_a_batch_err():
    ws = make(nthreads=2)
    [gather] = ws.handle(compute("y", dep("x", A)), compute("v", dep("u", A)))
    assert isinstance(gather, GatherDep) and sorted(gather.keys) == ["u", "x"]
    event = GatherSuccess(A, {"u": 1}, {"u": 5}, [], "g", failed={"x": BOOM})
    out = run(ws, event)
    assert [m.key for m in sent(out) if isinstance(m, TaskErred)] == ["y"]
    assert any(isinstance(i, Execute) and i.key == "v" for i in out)
    assert ws.data["u"] == 1 and "x" not in ws.data


def test_a_dependency_larger_than_the_memory_limit_is_never_fetched():
    ws = make(memory_limit=1000)
    out = run(ws, compute("y", dep("x", A, nbytes=5000), dep("small", A, nbytes=10)))
    assert not any(isinstance(i, GatherDep) and "x" in i.keys for i in out)
    [msg] = [m for m in sent(out) if isinstance(m, TaskErred)]
    assert (msg.key, msg.blamed) == ("y", "x")
    exc = pickle.loads(msg.exception.data)
    assert isinstance(exc, MemoryError)
    assert "'x'" in str(exc) and "5000 bytes" in str(exc) and "1000 bytes" in str(exc)
    assert ME in str(exc) and A in str(exc)
    assert "x" not in ws.tasks


def test_bytes_in_flight_are_accounted():
    ws = make(nthreads=2)
    assert ws.incoming_bytes == 0
    run(ws, compute("y", dep("x", A, nbytes=300)), compute("v", dep("u", B, nbytes=200)))
    assert ws.incoming_bytes == 500
    run(ws, gathered(A, "g1", x=1))
    assert ws.incoming_bytes == 200
    run(ws, failed_gather(B, u=BOOM))
    assert ws.incoming_bytes == 0


def test_bytes_in_flight_are_bounded_by_a_tenth_of_the_memory_limit():
    """Data on its way counts against memory: past 10% of the memory limit in flight,
    no further transfer starts until some lands (one always may, whatever its size)."""
    ws = make(nthreads=4, memory_limit=10_000)
    out = ws.handle(
        compute("y1", dep("x1", A, nbytes=600)),
        compute("y2", dep("x2", B, nbytes=600)),
        compute("y3", dep("x3", "tcp://c:1", nbytes=50)),
    )
    gathers = [i for i in out if isinstance(i, GatherDep)]
    assert [g.keys for g in gathers] == [["x1"], ["x2"]]  # 1,200 >= 1,000: the rest waits
    assert ws.incoming_bytes == 1200
    out = run(ws, gathered(A, "g1", x1=1))
    assert [i.keys for i in out if isinstance(i, GatherDep)] == [["x3"]]
