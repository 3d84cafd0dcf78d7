"""The scheduler state machine when workers die, pause, go silent, retire, or cannot
pickle a result (shoal/core/scheduler/membership.py). No network: events in, messages out."""

from __future__ import annotations

import pickle

import pytest
from scheduler_harness import W1, W2, W3, Sim, addr

from shoal.core.scheduler.membership import heartbeat_interval
from shoal.protocol.errors import KilledWorker
from shoal.protocol.messages import (
    CloseWorker,
    CopyKeys,
    Heartbeat,
    KeyErred,
    KeyInMemory,
    KeyUnserializable,
    RetireReply,
    RetireWorkers,
    WorkerLeaving,
    WorkerStatus,
)
from shoal.protocol.serialize import SerializationError


def erred_with(sim: Sim, key: str) -> BaseException:
    [msg] = [m for m in sim.to_client() if isinstance(m, KeyErred) and m.key == key]
    return pickle.loads(msg.exception.data)


# --- workers dying ----------------------------------------------------------------------


def test_task_on_too_many_dying_workers_errs_with_killed_worker():
    sim = Sim({addr(0): 1})
    sim.submit({"bad": [], "after": ["bad"]})
    for n in range(4):  # allowed_failures=3: the fourth death is one too many
        assert sim.state("bad") == "processing", n
        where = sim.worker_of("bad")
        sim.add_worker(addr(n + 1))
        sim.remove_worker(where, sid=f"killed-{n}")
    assert sim.state("bad") == "erred"
    assert sim.state("after") == "erred"
    exc = erred_with(sim, "bad")
    assert isinstance(exc, KilledWorker)
    assert exc.key == "bad"
    assert exc.workers == [addr(0), addr(1), addr(2), addr(3)]
    assert "4 workers that died" in str(exc) and addr(3) in str(exc)
    # the cluster goes on: other tasks run and finish
    sim.submit({"good": []})
    sim.finish("good")
    assert sim.state("good") == "memory"


def test_killed_worker_says_why_the_workers_died_when_it_is_known():
    sim = Sim({W1: 1})
    sim.s.allowed_failures = 1
    sim.submit({"hog": []})
    sim.add_worker(W2)
    memory = "exited: killed for memory: 1900 MB, over the terminate threshold (1900 MB)"
    sim.s.remove_worker(W1, "nanny-1", memory)
    sim.add_worker(W3)
    sim.s.remove_worker(W2, "closed-1")  # its connection dropped: no reason known
    exc = erred_with(sim, "hog")
    assert isinstance(exc, KilledWorker)
    assert exc.reasons == {W1: memory}
    assert f"{W1} ({memory})" in str(exc) and W2 in str(exc)
    assert "more memory than a worker has" in str(exc)
    assert pickle.loads(pickle.dumps(exc)).reasons == exc.reasons


def test_deaths_are_counted_per_task_and_forgotten_with_it():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"x": []})
    sim.remove_worker(sim.worker_of("x"))
    assert [len(v) for v in sim.s.suspicious.values()] == [1]
    sim.finish("x")
    sim.release("x")
    assert sim.state("x") == "forgotten"
    assert sim.s.suspicious == {}


def test_a_retired_worker_is_not_counted_as_a_death():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"x": []})
    sim.s.remove_worker(sim.worker_of("x"), "retired", expected=True)
    assert sim.s.suspicious == {}
    assert sim.state("x") == "processing"


def test_allowed_failures_zero_errs_at_the_first_death():
    sim = Sim({W1: 1, W2: 1})
    sim.s.allowed_failures = 0
    sim.submit({"x": [], "y": ["x"]})
    sim.remove_worker(sim.worker_of("x"))
    assert sim.state("x") == sim.state("y") == "erred"
    assert isinstance(erred_with(sim, "x"), KilledWorker)


# --- paused workers --------------------------------------------------------------------


def test_paused_worker_gets_no_new_tasks_until_it_resumes():
    sim = Sim({W1: 1, W2: 1})
    sim.s.handle_worker(W1, WorkerStatus("paused", "mem-high"))
    assert sim.s.workers[W1].status == "paused"
    sim.submit({f"r-{i}": [] for i in range(4)})
    assert sim.on(W1) == set()
    assert len(sim.on(W2)) == 2  # its slots; the rest wait in the queue
    assert sorted(k for k, st in sim.states().items() if st == "queued") != []
    sim.clear()
    sim.s.handle_worker(W1, WorkerStatus("running", "mem-ok"))
    assert len(sim.computes(W1)) == 2  # queued work goes to it at once


def test_paused_worker_finishes_what_it_runs_and_dependents_go_elsewhere():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    where = sim.worker_of("a")
    other = W2 if where == W1 else W1
    sim.s.handle_worker(where, WorkerStatus("paused", "mem-high"))
    sim.finish("a", worker=where)
    assert sim.state("a") == "memory"
    sim.submit({"b": ["a"]})
    assert sim.worker_of("b") == other  # not where the data is: that worker is paused


def test_all_workers_paused_tasks_wait():
    sim = Sim({W1: 1})
    sim.s.handle_worker(W1, WorkerStatus("paused", "p"))
    sim.submit({"a": [], "b": ["a"]})
    assert sim.state("a") == "queued"
    sim.s.handle_worker(W1, WorkerStatus("running", "r"))
    assert sim.state("a") == "processing"


def test_unknown_worker_status_is_refused():
    sim = Sim({W1: 1})
    with pytest.raises(TypeError, match="unknown worker status 'sleepy'"):
        sim.s.handle_worker(W1, WorkerStatus("sleepy", "s"))


# --- heartbeats -------------------------------------------------------------------------


def test_silent_worker_is_removed_after_the_ttl_and_its_tasks_rescheduled():
    sim = Sim({}, clients=("c",))
    sim.s.worker_ttl = 2.0
    sim.s.add_worker(W1, "1", 1, 2**30, "add", now=100.0)
    sim.s.add_worker(W2, "2", 1, 2**30, "add", now=100.0)
    sim.submit({"a": [], "b": []})
    stuck = sim.worker_of("a")
    alive = W2 if stuck == W1 else W1
    assert sim.s.heartbeat(alive, Heartbeat(1), now=101.5) == 0.5
    assert sim.s.check_heartbeats(101.9, "hb") == []
    assert sim.s.check_heartbeats(102.1, "hb") == [stuck]
    assert stuck not in sim.s.workers
    assert sim.s.story("a")[-1][-1] == "hb"
    [removed] = sim.s.story("worker-removed")
    assert removed[1] == stuck and removed[2] == "no heartbeat for 2.1s (TTL 2.0s)"
    assert sim.s.suspicious != {}  # a silent worker counts as a death for its tasks
    assert sim.worker_of("a") == alive or sim.state("a") == "queued"


def test_ttl_and_interval_grow_with_the_cluster():
    assert heartbeat_interval(1) == heartbeat_interval(25) == 0.5
    assert heartbeat_interval(100) == 2.0 and heartbeat_interval(1000) == 20.0
    sim = Sim({addr(i): 1 for i in range(400)})
    sim.s.worker_ttl = 2.0
    assert sim.s.worker_ttl_now() == 32.0  # at least four heartbeats of 8 s


def test_heartbeat_records_memory():
    sim = Sim({W1: 1})
    sim.s.heartbeat(W1, Heartbeat(1, memory=123, spilled=45, executing=1), now=5.0)
    [info] = sim.s.worker_infos()
    assert info.memory == 123 and sim.s.workers[W1].spilled == 45


# --- results that cannot be pickled -----------------------------------------------------


def test_unserializable_result_errs_the_task_and_its_dependents():
    sim = Sim({W1: 1})
    sim.submit({"a": [], "b": ["a"]}, wanted=["a", "b"])
    sim.finish("a")
    where = sim.worker_of("b")
    sim.clear()
    sim.s.handle_worker(W1, KeyUnserializable("a", "cannot pickle '_thread.lock'", "spill-1"))
    assert sim.state("a") == "erred"
    assert sim.state("b") == "erred"
    msgs = sim.to_client()
    errs = {m.key: pickle.loads(m.exception.data) for m in msgs if isinstance(m, KeyErred)}
    assert isinstance(errs["a"], SerializationError)
    assert "cannot pickle '_thread.lock'" in str(errs["a"])
    assert "b" in errs
    assert "b" in sim.freed(where)


def test_unserializable_replica_with_another_holder_only_drops_that_copy():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    sim.finish("a", worker=sim.worker_of("a"))
    holder = next(iter(sim.ts("a").who_has)).address
    other = W2 if holder == W1 else W1
    sim.add_keys(other, {"a": 8})
    sim.s.handle_worker(other, KeyUnserializable("a", "nope", "s"))
    assert sim.state("a") == "memory"
    assert {ws.address for ws in sim.ts("a").who_has} == {holder}


# --- retirement -------------------------------------------------------------------------


def retire(sim: Sim, *workers: str, request_id: int = 7, close: bool = True) -> None:
    sim.s.handle_client("c", RetireWorkers(request_id, list(workers), close))


def replies(sim: Sim) -> list[RetireReply]:
    return [m for m in sim.to_client() if isinstance(m, RetireReply)]


def test_retire_copies_unique_data_then_closes_the_worker():
    sim = Sim({W1: 1, W2: 1, W3: 1})
    sim.submit({"a": [], "b": []})
    for key in ("a", "b"):
        sim.finish(key, nbytes=100)
    src = next(iter(sim.ts("a").who_has)).address
    sim.clear()
    retire(sim, src)
    assert sim.s.workers[src].status == "retiring"
    copies = {
        w: [d.key for m in sim.comm.workers.get(w, []) if isinstance(m, CopyKeys) for d in m.deps]
        for w in (W1, W2, W3)
    }
    unique = {ts.key for ts in sim.s.workers[src].has_what}
    assert sorted(k for ks in copies.values() for k in ks) == sorted(unique)
    assert copies[src] == []
    assert replies(sim) == []  # not yet
    sim.clear()
    for w, keys in copies.items():
        if keys:
            sim.add_keys(w, dict.fromkeys(keys, 100))
    assert src not in sim.s.workers
    assert [type(m) for m in sim.comm.workers.get(src, [])] == [CloseWorker]
    [reply] = replies(sim)
    assert reply.request_id == 7 and reply.retired == [src] and reply.refused == {}
    assert sim.state("a") == sim.state("b") == "memory"
    assert sim.s.suspicious == {}


def test_retiring_worker_finishes_its_tasks_first_and_gets_no_new_ones():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"x": []})
    src = sim.worker_of("x")
    dst = W2 if src == W1 else W1
    retire(sim, src)
    assert src in sim.s.workers
    sim.submit({"y": [], "z": []})
    assert sim.on(src) == {"x"}  # nothing new
    sim.clear()
    sim.finish("x", worker=src)
    assert [d.key for m in sim.to_worker(dst) if isinstance(m, CopyKeys) for d in m.deps] == ["x"]
    sim.add_keys(dst, {"x": 8})
    assert src not in sim.s.workers
    assert replies(sim)[0].retired == [src]


def test_retire_is_refused_when_no_other_worker_can_take_the_data():
    sim = Sim({W1: 1})
    sim.submit({"a": []})
    sim.finish("a")
    retire(sim, W1)
    [reply] = replies(sim)
    assert reply.retired == [] and "no other running worker" in reply.refused[W1]
    assert sim.s.workers[W1].status == "running"
    sim.submit({"b": []})
    assert sim.worker_of("b") == W1  # keeps working


def test_retire_is_refused_when_others_lack_memory():
    sim = Sim({})
    sim.add_worker(W1, memory_limit=1000)
    sim.add_worker(W2, memory_limit=1000)
    sim.submit({"big": []})
    sim.finish("big", nbytes=500)
    holder = next(iter(sim.ts("big").who_has)).address
    other = W2 if holder == W1 else W1
    sim.s.workers[other].memory_limit = 100  # the other has room for 100 bytes only
    sim.s.total_memory -= 900
    retire(sim, holder)
    [reply] = replies(sim)
    assert "room for 100 of the 500 bytes" in reply.refused[holder]
    assert sim.s.workers[holder].status == "running"


def test_retire_unknown_worker_and_by_name():
    sim = Sim({W1: 1, W2: 1})
    retire(sim, "nobody", "w2:1")  # the harness names workers by host:port
    [reply] = replies(sim)
    assert reply.refused == {"nobody": "no such worker"}
    assert reply.retired == [W2]


def test_copy_is_asked_again_when_its_recipient_leaves():
    sim = Sim({W1: 1, W2: 1, W3: 1})
    sim.submit({"a": []})
    src = sim.worker_of("a")
    sim.finish("a")
    sim.clear()
    retire(sim, src)
    [to] = [w for w in (W1, W2, W3) if any(isinstance(m, CopyKeys) for m in sim.to_worker(w))]
    sim.remove_worker(to)
    sim.clear()
    sim.s.heartbeat(src, Heartbeat(1), now=1.0)
    [again] = [w for w in (W1, W2, W3) if any(isinstance(m, CopyKeys) for m in sim.to_worker(w))]
    assert again not in (to, src)
    sim.add_keys(again, {"a": 8})
    assert src not in sim.s.workers


def test_retiring_worker_that_dies_is_reported_refused_and_its_data_recomputed():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    src = sim.worker_of("a")
    sim.finish("a")
    retire(sim, src)
    sim.remove_worker(src)
    [reply] = replies(sim)
    assert reply.retired == [] and "it left before retiring" in reply.refused[src]
    assert sim.state("a") == "processing"  # recomputed elsewhere
    assert not any(isinstance(m, KeyInMemory) for m in sim.to_client())


# --- workers leaving on their own (WorkerLeaving: SIGTERM, a restart) -----------------


def leave(sim: Sim, worker: str, retire: bool = True, sid: str = "leaving") -> None:
    sim.s.handle_worker(worker, WorkerLeaving("received SIGTERM", retire, sid))


def copies_to(sim: Sim, *workers: str) -> dict[str, list]:
    return {
        w: [d.key for m in sim.comm.workers.get(w, []) if isinstance(m, CopyKeys) for d in m.deps]
        for w in workers
    }


def test_leaving_worker_hands_off_its_data_then_is_closed():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": [], "b": []})
    sim.finish("a", nbytes=100)
    sim.finish("b", nbytes=100)
    src = next(iter(sim.ts("a").who_has)).address
    dst = W2 if src == W1 else W1
    sim.clear()
    leave(sim, src)
    assert sim.s.workers[src].status == "retiring" and src not in sim.s.runnable
    unique = sorted(ts.key for ts in sim.s.workers[src].has_what)
    assert sorted(copies_to(sim, dst)[dst]) == unique
    assert src in sim.s.workers  # not before its data is safe
    sim.submit({"c": []})
    assert sim.worker_of("c") == dst  # nothing new for the leaving worker
    sim.clear()
    sim.add_keys(dst, dict.fromkeys(unique, 100))
    assert src not in sim.s.workers
    [close] = sim.to_worker(src)
    assert isinstance(close, CloseWorker)
    assert sim.state("a") == sim.state("b") == "memory"  # nothing recomputed
    assert {ts.address for k in "ab" for ts in sim.ts(k).who_has} == {dst}
    assert sim.s.suspicious == {} and sim.s.leaving == {}
    assert not any(isinstance(m, RetireReply) for m in sim.to_client())  # nobody asked


def test_leaving_worker_gives_up_its_running_tasks_at_once_and_they_count_no_death():
    sim = Sim({W1: 1, W2: 1})
    sim.s.allowed_failures = 0  # a single counted death would err the task
    sim.submit({"x": [], "y": []})
    src = sim.worker_of("x")
    dst = W2 if src == W1 else W1
    sim.clear()
    leave(sim, src, sid="sigterm-1")
    assert "x" in sim.freed(src)  # its copy of the task is dropped
    assert sim.on(dst) == {"x", "y"}  # gone elsewhere at once
    assert sim.s.workers.get(src) is None  # no data: closed at once
    # its connection then drops: still not a death, nothing erred
    sim.remove_worker(src)
    assert sim.s.suspicious == {}
    sim.run_all()
    assert sim.state("x") == sim.state("y") == "memory"


def test_connection_dropping_while_handing_off_is_not_a_death():
    sim = Sim({W1: 1, W2: 1})
    sim.s.allowed_failures = 0
    sim.submit({"a": []})
    src = sim.worker_of("a")
    sim.finish("a")
    sim.submit({"x": []})
    where = sim.worker_of("x")
    leave(sim, where)
    if where == src:  # it still holds "a": not closed yet
        assert src in sim.s.workers and src in sim.s.leaving
    sim.remove_worker(where)  # the process exits before the copy arrived
    assert sim.s.suspicious == {} and sim.s.leaving == {} and sim.s.retiring == {}
    sim.run_all()
    assert sim.state("a") == sim.state("x") == "memory"


def test_leaving_without_retiring_removes_the_worker_now():
    sim = Sim({W1: 1, W2: 1})
    sim.s.allowed_failures = 0
    sim.submit({"a": []})
    src = sim.worker_of("a")
    sim.finish("a")
    sim.submit({"x": ["a"], "y": []})
    sim.clear()
    leave(sim, src, retire=False, sid="restart-1")
    assert src not in sim.s.workers and sim.s.leaving == {}
    msgs = sim.to_worker(src)
    assert isinstance(msgs[-1], CloseWorker) and "removed as it asked" in msgs[-1].reason
    assert msgs[-1].stimulus_id == "restart-1"
    assert copies_to(sim, W1, W2) == {W1: [], W2: []}  # no hand-off
    assert sim.s.suspicious == {}
    sim.run_all()  # "a" was lost with it: recomputed
    assert {k: sim.state(k) for k in "axy"} == dict.fromkeys("axy", "memory")
    assert not any(isinstance(m, KeyErred) for m in sim.to_client())


def test_last_worker_leaving_goes_at_once_and_its_work_waits_for_the_next():
    sim = Sim({W1: 2})
    sim.submit({"a": []})
    sim.finish("a")
    sim.submit({"b": ["a"], "c": []})
    sim.clear()
    leave(sim, W1)  # nobody can take "a": it is lost with the worker, not kept waiting
    assert W1 not in sim.s.workers
    assert [type(m) for m in sim.to_worker(W1)][-1] is CloseWorker
    sim.add_worker(W2)  # the nanny's new worker
    sim.run_all()
    assert {k: sim.state(k) for k in "abc"} == dict.fromkeys("abc", "memory")
    assert sim.s.suspicious == {}


def test_every_worker_leaving_at_once_with_work_submitted_finishes_on_new_workers():
    sim = Sim({W1: 1, W2: 1, W3: 1})
    sim.s.allowed_failures = 0
    dag = {f"t{i}": [] for i in range(12)}
    dag.update({f"s{i}": [f"t{i}", f"t{(i + 1) % 12}"] for i in range(12)})
    sim.submit(dag)
    for key in sorted(sim.processing())[:2]:
        sim.finish(key)
    for w in (W1, W2, W3):
        leave(sim, w, sid=f"sigterm-{w}")
    for w in (W1, W2, W3):  # their processes exit (closed, or not yet)
        sim.remove_worker(w)
    assert sim.s.workers == {} and sim.s.suspicious == {}
    for n in (4, 5):
        sim.add_worker(addr(n))
    sim.run_all()
    assert set(sim.states().values()) == {"memory"}


def test_a_late_result_from_a_leaving_worker_is_harmless():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"x": []})
    src = sim.worker_of("x")
    dst = W2 if src == W1 else W1
    leave(sim, src)
    sim.finish("x", worker=dst)
    # the old thread finished too and reports after it was let go: ignored
    sim.finish("x", worker=src)
    assert sim.state("x") == "memory"
    assert {ws.address for ws in sim.ts("x").who_has} == {dst}
