"""The scheduler state machine, driven with events only: transitions, the queue of root
tasks, placement and the messages it sends.

Every scheduler runs with ``validate=True`` (see ``scheduler_harness.Sim``), so every
invariant is checked after each event. More in ``test_scheduler_errors.py`` (errors,
release, cancel, scatter) and ``test_scheduler_workers.py`` (workers coming and going,
replicas, counters, validation).
"""

from __future__ import annotations

import pytest
from scheduler_harness import ARGS, FUNCS, W1, W2, W3, Sim, addr, kinds

from shoal.core.scheduler.model import SMALL, UNKNOWN_DURATION, Members, added, discarded
from shoal.core.scheduler.placement import MAX_PER_THREAD, QUEUE_HORIZON
from shoal.protocol.framing import decode_body, encode_body
from shoal.protocol.messages import (
    ComputeTask,
    DepInfo,
    FreeKeys,
    FunctionDefs,
    KeyInMemory,
    Payload,
    ReleaseCompute,
    SubmitTasks,
    TaskSpec,
)


def story(sim: Sim, key) -> list[tuple[str, str, str]]:
    """The transitions of ``key``: (start, finish, stimulus_id)."""
    return [entry[1:] for entry in sim.s.story(key)]


# --- the transition table, one edge at a time ---------------------------------------------


def test_root_task_released_waiting_queued_processing_memory():
    sim = Sim()
    sim.submit({"a": []})
    assert sim.states() == {"a": "processing"}
    assert sim.to_worker(W1) == [
        FunctionDefs(FUNCS),
        ComputeTask("a", "f", ARGS, (0, 0, 0), [], "submit", run_id=1, client_wants=True),
    ]
    assert sim.to_client() == []
    sim.finish("a", nbytes=16, value=Payload(0, b"\x01"))
    assert sim.states() == {"a": "memory"}
    assert sim.to_client() == [KeyInMemory("a", Payload(0, b"\x01"), "int", "done-a", [W1])]
    assert sim.to_worker(W1) == []
    assert story(sim, "a") == [
        ("released", "waiting", "submit"),
        ("waiting", "queued", "submit"),
        ("queued", "processing", "submit"),
        ("processing", "memory", "done-a"),
    ]
    ts = sim.ts("a")
    assert set(ts.who_has) == {sim.ws(W1)} and ts.nbytes == 16
    assert sim.ws(W1).has_what == {ts} and sim.ws(W1).nbytes == 16
    assert sim.ws(W1).tasks_run == 1 and sim.ws(W1).processing == set()


def test_dependent_goes_waiting_to_processing_with_dep_info():
    sim = Sim()
    sim.submit({"a": [], "b": ["a"]}, wanted=["b"])
    assert sim.states() == {"a": "processing", "b": "waiting"}
    assert set(sim.ts("b").waiting_on) == {sim.ts("a")}
    assert set(sim.ts("a").waiters) == {sim.ts("b")}
    sim.clear()
    sim.finish("a", nbytes=100)
    assert sim.states() == {"a": "memory", "b": "processing"}
    assert sim.to_worker(W1) == [
        ComputeTask(
            "b",
            "f",
            ARGS,
            (0, 0, 1),
            [DepInfo("a", 100, [W1])],
            "done-a",
            run_id=1,
            client_wants=True,
        )
    ]
    assert sim.to_client() == []  # nobody wants "a"
    # b done: "a" has no waiter and no client left, so its holder frees it
    sim.finish("b")
    assert sim.states() == {"a": "released", "b": "memory"}
    assert sim.to_worker(W1) == [FreeKeys(["a"], "done-b")]
    assert sim.to_client() == [KeyInMemory("b", None, "int", "done-b", [W1])]
    assert story(sim, "b") == [
        ("released", "waiting", "submit"),
        ("waiting", "processing", "done-a"),
        ("processing", "memory", "done-b"),
    ]
    assert story(sim, "a")[-1] == ("memory", "released", "done-b")
    assert sim.ws(W1).has_what == {sim.ts("b")} and sim.ws(W1).nbytes == 8


def test_a_dependency_named_twice_is_one_dependency():
    sim = Sim()
    sim.submit({"a": [], "b": ["a", "a"]}, wanted=["b"])
    assert sim.ts("b").dependencies == (sim.ts("a"),)
    assert sim.ts("a").dependents == sim.ts("a").waiters == (sim.ts("b"),)
    sim.clear()
    sim.finish("a", nbytes=100)
    assert sim.to_worker(W1) == [
        ComputeTask(
            "b",
            "f",
            ARGS,
            (0, 0, 1),
            [DepInfo("a", 100, [W1])],
            "done-a",
            run_id=1,
            client_wants=True,
        )
    ]
    sim.finish("b")
    assert sim.states() == {"a": "released", "b": "memory"}
    sim.release("b")
    assert sim.states() == {}


def test_waiting_to_released_and_forgotten():
    sim = Sim()
    sim.submit({"a": [], "b": ["a"]})
    sim.release("b", sid="rel")
    assert sim.states() == {"a": "processing"}
    assert story(sim, "b")[-2:] == [
        ("waiting", "released", "rel"),
        ("released", "forgotten", "rel"),
    ]
    assert set(sim.ts("a").waiters) == set() and set(sim.ts("a").dependents) == set()


def test_queued_to_released_leaves_a_stale_queue_entry_that_is_skipped():
    sim = Sim()
    sim.submit({"a": [], "b": [], "c": [], "d": []})
    assert sim.states() == {"a": "processing", "b": "processing", "c": "queued", "d": "queued"}
    assert sim.s.nqueued == 2
    sim.release("c", sid="rel")
    assert "c" not in sim.s.tasks and sim.s.nqueued == 1
    assert story(sim, "c")[-2:] == [("queued", "released", "rel"), ("released", "forgotten", "rel")]
    sim.clear()
    sim.finish("a")
    assert sim.computes(W1) == ["d"]
    assert sim.s.nqueued == 0


def test_processing_to_released_frees_the_worker():
    sim = Sim()
    sim.submit({"a": []})
    sim.clear()
    sim.release("a", sid="rel")
    assert sim.s.tasks == {}
    assert sim.to_worker(W1) == [ReleaseCompute("a", True, False, "rel")]
    assert sim.ws(W1).processing == set() and sim.ws(W1).occupancy == 0
    assert story(sim, "a")[-2:] == [
        ("processing", "released", "rel"),
        ("released", "forgotten", "rel"),
    ]
    # its thread counts busy until the worker says it is free
    assert sim.ws(W1).draining == {"a": 1} and sim.ws(W1) not in sim.s.free_workers
    sim.drained(W1, "a")
    assert sim.ws(W1).draining == {} and sim.ws(W1) in sim.s.free_workers
    # the worker's late answer is stale: it is told to drop the result
    sim.finish("a", worker=W1, sid="late")
    assert sim.to_worker(W1) == [FreeKeys(["a"], "late")]
    assert sim.s.tasks == {}


def test_memory_to_released_and_forgotten_frees_every_holder():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a": []})
    sim.finish("a", nbytes=10)
    sim.add_keys(W2, {"a": 10})
    sim.clear()
    sim.release("a", sid="rel")
    assert sim.s.tasks == {}
    assert sim.to_worker(W1) == [FreeKeys(["a"], "rel")]
    assert sim.to_worker(W2) == [FreeKeys(["a"], "rel")]
    assert sim.ws(W1).nbytes == sim.ws(W2).nbytes == 0
    assert story(sim, "a")[-2:] == [("memory", "released", "rel"), ("released", "forgotten", "rel")]


def test_processing_to_erred_and_erred_to_released():
    sim = Sim()
    sim.submit({"a": [], "b": ["a"]})
    sim.fail("a", sid="boom")
    assert sim.states() == {"a": "erred", "b": "erred"}
    assert story(sim, "a")[-1] == ("processing", "erred", "boom")
    assert story(sim, "b")[-1] == ("waiting", "erred", "boom")
    assert sim.ws(W1).processing == set()
    # releasing "a" alone: it keeps a dependent, so it stays as released
    sim.release("a", sid="rel")
    assert sim.states() == {"a": "released", "b": "erred"}
    assert story(sim, "a")[-1] == ("erred", "released", "rel")
    sim.release("b", sid="rel2")
    assert sim.s.tasks == {}
    assert story(sim, "b")[-2:] == [
        ("erred", "released", "rel2"),
        ("released", "forgotten", "rel2"),
    ]
    assert story(sim, "a")[-1] == ("released", "forgotten", "rel2")


def test_released_to_erred_for_a_task_that_cannot_run():
    sim = Sim()
    sim.submit({"a": ["nowhere"]}, sid="sub")
    assert sim.states() == {"a": "erred"}
    assert story(sim, "a") == [("released", "erred", "sub")]


@pytest.mark.parametrize("start", ["waiting", "queued", "processing", "memory", "erred"])
def test_two_step_paths_to_forgotten_go_through_released(start):
    sim = Sim()
    sim.submit({"busy1": [], "busy2": []})  # fill the worker's slots
    dag = {"x": []} if start in ("queued", "processing", "memory", "erred") else {"x": ["busy1"]}
    if start in ("processing", "memory", "erred"):
        sim.release("busy1", "busy2")
        if start == "processing":
            sim.drained(W1, "busy1", "busy2")
    sim.submit(dag, sid="sub")
    if start in ("memory", "erred"):
        sim.drained(W1, "busy1", "busy2")
        (sim.finish if start == "memory" else sim.fail)("x")
    assert sim.state("x") == start
    sim.release("x", sid="rel")
    assert sim.state("x") == "forgotten"
    assert story(sim, "x")[-2:] == [(start, "released", "rel"), ("released", "forgotten", "rel")]


def test_impossible_transitions_are_not_in_the_table():
    table = Sim().s._table
    assert ("released", "memory") not in table
    assert ("queued", "memory") not in table
    assert ("memory", "processing") not in table
    assert ("waiting", "memory") not in table
    assert len(table) == 14


# --- the queue of root tasks -------------------------------------------------------------------


@pytest.mark.parametrize("nthreads", [1, 2, 4])
def test_root_tasks_queue_and_go_out_as_slots_free(nthreads):
    sim = Sim({W1: nthreads})
    keys = [f"r-{i}" for i in range(10)]
    sim.submit(dict.fromkeys(keys, []))
    slots = nthreads + 1
    assert sim.ws(W1).min_slots == slots
    assert sim.computes(W1) == keys[:slots]
    assert [k for k in keys if sim.state(k) == "queued"] == keys[slots:]
    assert sim.s.nqueued == 10 - slots
    assert sim.ws(W1) not in sim.s.free_workers
    assert sim.ws(W1).occupancy == pytest.approx(slots * UNKNOWN_DURATION)
    # each result frees one slot, which takes the next task in order
    for i in range(10 - slots):
        sim.finish(keys[i])
        assert sim.computes(W1) == [keys[slots + i]]
    assert sim.s.nqueued == 0 and sim.ws(W1) not in sim.s.free_workers
    sim.finish(keys[-1])
    assert sim.computes(W1) == [] and sim.ws(W1) in sim.s.free_workers


def test_short_tasks_fill_the_queue_horizon():
    """Once a prefix is measured as tiny, a worker may hold tasks worth QUEUE_HORIZON
    seconds per thread beyond its slots, so it never idles for a round trip."""
    assert QUEUE_HORIZON == 0.02
    sim = Sim()
    keys = [f"r-{i}" for i in range(30)]
    sim.submit(dict.fromkeys(keys, []))
    assert sim.computes(W1) == keys[:2]  # unknown duration: just min_slots
    sim.finish("r-0", duration=0.003)
    assert sim.computes(W1) == ["r-2"]  # r-1 is still estimated at 0.5 s
    sim.finish("r-1", duration=0.003)
    # estimates 0.003 s: 6 tasks (0.018 s) are under the horizon, the 7th crosses it
    assert sim.computes(W1) == keys[3:9]
    assert len(sim.ws(W1).processing) == 7
    assert sim.ws(W1).occupancy == pytest.approx(7 * 0.003)
    assert sim.ws(W1) not in sim.s.free_workers
    assert sim.ts("r-9").state == "queued"


def test_horizon_scales_with_threads_and_is_capped():
    sim = Sim({W1: 2})
    sim.submit({"r-0": []})
    sim.finish("r-0", duration=0.001)
    sim.clear()
    keys = [f"r-{i}" for i in range(1, 60)]
    sim.submit(dict.fromkeys(keys, []))
    # 2 threads: 0.04 s of 0.001 s tasks, i.e. 39 free, the 40th crosses (or meets) it
    n = len(sim.computes(W1))
    assert 39 <= n <= 41
    assert sim.ws(W1).occupancy >= 2 * QUEUE_HORIZON - 1e-9
    assert MAX_PER_THREAD == 1000


def test_queue_order_user_priority_then_submission_order():
    sim = Sim()
    sim.submit({"busy-1": [], "busy-2": []})
    sim.submit({"a-0": [], "a-1": []})
    sim.submit({"b-0": [], "b-1": [], "b-2": []}, priority={"b-1": 5, "b-2": -1})
    sim.submit({"c-0": []}, priority={"c-0": 5})
    assert sim.ts("b-1").priority == (-5, 2, 1)
    sim.clear()
    order = []
    for key in ["busy-1", "busy-2", "b-1", "c-0", "a-0", "a-1", "b-0"]:
        sim.finish(key)
        order += sim.computes(W1)
    assert order == ["b-1", "c-0", "a-0", "a-1", "b-0", "b-2"]


def test_compute_task_carries_the_priority():
    sim = Sim()
    sim.submit({"x": []}, priority={"x": 3})
    (compute,) = [msg for msg in sim.to_worker(W1) if isinstance(msg, ComputeTask)]
    assert compute.priority == (-3, 0, 0)


def test_tasks_wait_in_the_queue_until_a_worker_joins():
    sim = Sim(workers={})
    sim.submit({"a": [], "b": [], "c": [], "d": ["a"]})
    assert sim.states() == {"a": "queued", "b": "queued", "c": "queued", "d": "waiting"}
    assert sim.s.nqueued == 3
    sim.add_worker(W1, 2)
    assert sim.computes(W1) == ["a", "b", "c"]
    assert sim.s.nqueued == 0
    sim.finish("a")
    assert sim.computes(W1) == ["d"]


def test_queue_hands_one_task_at_a_time_to_the_least_loaded_worker():
    sim = Sim({W1: 1})
    sim.submit({"a": []})
    sim.add_worker(W2, 1)
    sim.clear()
    sim.submit({"b": [], "c": [], "d": [], "e": []})
    # W2 (empty) first; then ties go by address; each worker stops at its 2 slots
    assert sim.computes(W2) == ["b", "d"]
    assert sim.computes(W1) == ["c"]
    assert sim.state("e") == "queued"


def test_idle_workers_each_get_a_root_task_before_any_gets_a_second():
    sim = Sim({addr(i): 1 for i in range(1, 5)})
    sim.submit({f"r-{i}": [] for i in range(4)})
    assert [sim.computes(addr(i)) for i in range(1, 5)] == [["r-0"], ["r-1"], ["r-2"], ["r-3"]]
    sim.submit({f"s-{i}": [] for i in range(6)})
    assert [len(sim.on(addr(i))) for i in range(1, 5)] == [2, 2, 2, 2]
    assert sim.s.nqueued == 2 and sim.s.free_workers == set()


def test_queue_spreads_over_workers_added_later():
    sim = Sim({W1: 1})
    sim.submit({f"r-{i}": [] for i in range(6)})
    assert len(sim.on(W1)) == 2
    sim.add_worker(W2, 2)
    assert sim.computes(W2) == ["r-2", "r-3", "r-4"]
    assert sim.state("r-5") == "queued"


# --- placement -------------------------------------------------------------------------------


def _two_holders(sim: Sim, a_bytes: int, b_bytes: int) -> None:
    """Key "a" in memory on W1 and "b" on W2, with the given sizes."""
    sim.submit({"a": [], "b": []})
    assert sim.on(W1) == {"a"} and sim.on(W2) == {"b"}
    sim.finish("a", nbytes=a_bytes)
    sim.finish("b", nbytes=b_bytes)


def test_dependent_goes_where_most_dependency_bytes_are():
    sim = Sim({W1: 1, W2: 1})
    _two_holders(sim, 10**9, 10)
    sim.clear()
    sim.submit({"c": ["a", "b"]})
    assert sim.worker_of("c") == W1
    (compute,) = [msg for msg in sim.to_worker(W1) if isinstance(msg, ComputeTask)]
    assert sorted(compute.deps, key=lambda d: d.key) == [
        DepInfo("a", 10**9, [W1]),
        DepInfo("b", 10, [W2]),
    ]
    sim2 = Sim({W1: 1, W2: 1})
    _two_holders(sim2, 10, 10**9)
    sim2.submit({"c": ["a", "b"]})
    assert sim2.worker_of("c") == W2


@pytest.mark.parametrize("nbytes, where", [(10**10, W1), (100, W2)])
def test_locality_against_occupancy(nbytes, where):
    """W1 holds "a" and is busy, W2 is idle. Moving 10 GB (100 s at the assumed
    bandwidth) costs more than waiting for W1; moving 100 bytes (1 µs) does not."""
    sim = Sim({W1: 1})
    sim.submit({"a": []})
    sim.finish("a", nbytes=nbytes)
    sim.submit({"busy-1": [], "busy-2": []})
    sim.add_worker(W2, 1)
    assert sim.on(W1) == {"busy-1", "busy-2"} and sim.on(W2) == set()
    sim.submit({"c": ["a"]})
    assert sim.worker_of("c") == where


@pytest.mark.parametrize("busy", [W1, W2])
def test_ties_in_bytes_go_to_the_least_occupied_holder(busy):
    sim = Sim({busy: 1})
    sim.submit({"x": []})
    sim.finish("x", nbytes=10**9)
    sim.submit({"r-1": [], "r-2": []})  # load on the first worker only
    other = W2 if busy == W1 else W1
    sim.add_worker(other, 1)
    sim.add_keys(other, {"x": 10**9})
    sim.clear()
    sim.submit({"y": ["x"]})
    assert sim.worker_of("y") == other
    (compute,) = [msg for msg in sim.to_worker(other) if isinstance(msg, ComputeTask)]
    (dep,) = compute.deps
    assert dep.key == "x" and sorted(dep.who_has) == [W1, W2]


def test_equal_workers_tie_break_by_address():
    sim = Sim({W2: 1, W1: 1, W3: 1})
    sim.submit({"a": []})
    assert sim.on(W1) == {"a"}
    sim.finish("a", nbytes=0)
    sim.submit({"b": ["a"]})
    assert sim.worker_of("b") == W1


# --- functions -------------------------------------------------------------------------------


def test_function_defs_sent_once_per_worker_per_function():
    sim = Sim({W1: 4, W2: 4})
    functions = {"f": b"F", "g": b"G"}
    sim.submit({"a": [], "b": [], "c": [], "d": []}, func={"c": "g", "d": "g"}, functions=functions)
    # the queue alternates between the two idle workers: a, c to W1; b, d to W2
    for worker, (first, second) in [(W1, "ac"), (W2, "bd")]:
        assert sim.to_worker(worker) == [
            FunctionDefs({"f": b"F"}),
            ComputeTask(
                first, "f", ARGS, sim.ts(first).priority, [], "submit", run_id=1, client_wants=True
            ),
            FunctionDefs({"g": b"G"}),
            ComputeTask(
                second,
                "g",
                ARGS,
                sim.ts(second).priority,
                [],
                "submit",
                run_id=1,
                client_wants=True,
            ),
        ]
    # known functions need not be sent again by the client, nor by the scheduler
    sim.submit({"e": [], "e2": []}, func={"e2": "g"}, functions={})
    assert kinds(sim.to_worker(W1)) == ["ComputeTask"]
    assert kinds(sim.to_worker(W2)) == ["ComputeTask"]
    assert sim.ws(W1).known_functions == sim.ws(W2).known_functions == {"f", "g"}
    # a worker that joins later gets each function with its first task that uses it
    sim.add_worker(W3, 2)
    sim.submit({f"h-{i}": [] for i in range(3)}, func={f"h-{i}": "g" for i in range(3)})
    assert kinds(sim.to_worker(W3)) == ["FunctionDefs", "ComputeTask", "ComputeTask"]
    assert sim.ws(W3).known_functions == {"g"}


def test_tasks_share_one_copy_of_their_function_id():
    # Decoded from the wire, each task's function id is a str of its own; the scheduler
    # keeps one copy per function instead of one per task.
    sim = Sim()
    fid = "5f2d0c4b9a8e7d6c5b4a3f2e"
    for keys, functions in [("ab", {fid: b"F"}), ("c", {})]:
        specs = [TaskSpec(k, fid, ARGS) for k in keys]
        (msg,) = decode_body(encode_body([SubmitTasks(specs, list(keys), functions, "s")]))
        assert msg.tasks[0].func == fid and msg.tasks[0].func is not fid
        sim.s.handle_client("c", msg)
    assert len({id(sim.ts(k).func) for k in "abc"}) == 1 and sim.ts("a").func == fid


def test_tuple_keys_share_their_group_name():
    # Likewise each decoded tuple key has its own copy of the name: tasks keep the group's.
    sim = Sim()
    name = "ones-5f2d0c4b9a8e7d6c5b4a3f2e5f2d0c4b"
    specs = [TaskSpec((name, i), "f", ARGS) for i in range(3)]
    specs.append(TaskSpec((name, 3), "f", ARGS, [(name, 0)], group="other"))
    msg = SubmitTasks(specs, [s.key for s in specs], FUNCS, "s")
    (msg,) = decode_body(encode_body([msg]))
    sim.s.handle_client("c", msg)
    group = sim.s.groups[name]
    for i in range(3):
        ts = sim.ts((name, i))
        assert ts.key == (name, i) and ts.key[0] is group.name and ts.group is group
    assert sim.ts((name, 3)).key[0] is not group.name  # not its group's name: kept as sent
    assert sim.ts((name, 3)).dependencies == (sim.ts((name, 0)),)
    sim.run_all()
    assert sim.states() == {(name, i): "memory" for i in range(4)}


def test_a_rejoining_worker_gets_its_functions_again():
    sim = Sim()
    sim.submit({"a": []})
    sim.finish("a")
    sim.remove_worker(W1)
    sim.clear()
    sim.add_worker(W1)
    assert sim.state("a") == "processing"
    assert kinds(sim.to_worker(W1)) == ["FunctionDefs", "ComputeTask"]


# --- bookkeeping across many tasks -----------------------------------------------------------


def test_wide_fan_in_runs_to_completion():
    sim = Sim({addr(i): 2 for i in range(1, 4)})
    dag: dict = {f"x-{i}": [] for i in range(20)}
    dag.update({f"y-{i}": [f"x-{i}", f"x-{(i + 1) % 20}"] for i in range(20)})
    dag["total"] = [f"y-{i}" for i in range(20)]
    sim.submit(dag, wanted=["total"])
    sim.run_all()
    assert sim.states()["total"] == "memory"
    assert {k for k, st in sim.states().items() if st == "memory"} == {"total"}
    assert sim.s.nqueued == 0
    assert sum(ws.tasks_run for ws in sim.s.workers.values()) == 41
    sim.release("total")
    assert sim.s.tasks == {} and sim.s.groups == {}


def test_wide_fan_out_runs_to_completion():
    # More dependents than SMALL: "x"'s dependents and waiters become sets, then empty.
    sim = Sim({addr(i): 2 for i in range(1, 4)})
    n = SMALL * 2 + 1
    sim.submit(
        {"x": [], **{f"y-{i}": ["x"] for i in range(n)}}, wanted=[f"y-{i}" for i in range(n)]
    )
    assert type(sim.ts("x").dependents) is set and len(sim.ts("x").waiters) == n
    sim.run_all()
    assert sim.states() == {"x": "released", **{f"y-{i}": "memory" for i in range(n)}}
    assert sim.ts("x").waiters == () and len(sim.ts("x").dependents) == n
    sim.release(*[f"y-{i}" for i in range(n - 1)])
    assert set(sim.ts("x").dependents) == {sim.ts(f"y-{n - 1}")}  # a set stays one till empty
    sim.release(f"y-{n - 1}")
    assert sim.s.tasks == {} and sim.s.groups == {}


def test_members_are_distinct_in_a_tuple_while_small_then_a_set():
    members: Members[int] = ()
    for i in range(SMALL):
        members = added(added(members, i), i)
        assert members == tuple(range(i + 1))
    members = added(members, SMALL)
    assert members == set(range(SMALL + 1))
    assert added(members, 0) is members and discarded(members, 0) is members
    for i in range(1, SMALL + 1):
        members = discarded(discarded(members, i), i)
    assert members == ()  # not an empty set
    assert discarded((1, 2, 3), 2) == (1, 3) and discarded((1,), 1) == ()
    assert discarded((1, 3), 2) == (1, 3)
