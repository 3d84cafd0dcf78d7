"""Progress watches and task-group queries in the scheduler core: counts kept as tasks
finish, sent to the watching client only when they changed; no network."""

from __future__ import annotations

from scheduler_harness import W1, W2, Sim

from shoal.protocol.messages import ProgressCounts, StopProgress, WatchProgress


def watch(sim: Sim, *keys, watch_id: int = 1, client: str = "c") -> None:
    sim.s.handle_client(client, WatchProgress(watch_id, list(keys), "watch"))


def progress_msgs(sim: Sim, client: str = "c") -> list[ProgressCounts]:
    msgs = [msg for msg in sim.to_client(client) if type(msg) is ProgressCounts]
    sim.comm.clients[client].clear()
    return msgs


def counts(msg: ProgressCounts) -> dict[str, tuple[int, int, int]]:
    return {p.name: (p.total, p.memory, p.erred) for p in msg.prefixes}


GRAPH = {
    "inc-1": [],
    "inc-2": [],
    "inc-3": [],
    "double-1": ["inc-1"],
    "double-2": ["inc-2"],
    "sum-1": ["double-1", "double-2", "inc-3"],
}


def test_watch_counts_the_closure_per_prefix_as_tasks_finish():
    sim = Sim({W1: 2, W2: 2})
    sim.submit(GRAPH, wanted=["sum-1"])
    watch(sim, "sum-1")
    [first] = progress_msgs(sim)
    assert counts(first) == {"inc": (3, 0, 0), "double": (2, 0, 0), "sum": (1, 0, 0)}
    assert not first.finished
    sim.finish("inc-1")
    sim.finish("inc-2")
    assert progress_msgs(sim) == []  # nothing until the scheduler flushes
    sim.s.flush_progress()
    [msg] = progress_msgs(sim)
    assert counts(msg) == {"inc": (3, 2, 0), "double": (2, 0, 0), "sum": (1, 0, 0)}
    sim.s.flush_progress()
    assert progress_msgs(sim) == []  # unchanged: nothing sent
    sim.run_all()
    sim.s.flush_progress()
    [last] = progress_msgs(sim)
    assert counts(last) == {"inc": (3, 3, 0), "double": (2, 2, 0), "sum": (1, 1, 0)}
    assert last.finished and last.forgotten == 0
    assert sim.s.clients["c"].watches == {}  # ended with its last message
    # intermediate results were released on the way and still count as done
    assert sim.state("inc-1") == "released" or "inc-1" not in sim.s.tasks


def test_watch_of_finished_keys_ends_at_once_counting_what_they_needed_as_done():
    sim = Sim({W1: 2})
    sim.submit(GRAPH, wanted=["sum-1", "inc-1"])
    sim.run_all()
    assert sim.state("double-1") == "released"  # its result was freed after use
    watch(sim, "sum-1", "inc-1", "unknown-key")
    [msg] = progress_msgs(sim)
    assert counts(msg) == {"sum": (1, 1, 0), "inc": (3, 3, 0), "double": (2, 2, 0)}
    assert msg.finished and sim.s.clients["c"].watches == {}


def test_watch_mid_run_counts_finished_work_and_marks_only_what_is_left():
    sim = Sim({W1: 1})
    sim.submit({"a-1": [], "b-1": ["a-1"], "a-2": [], "b-2": ["a-2"], "c-1": ["b-1", "b-2"]})
    sim.finish(sim.processing()[0])  # one "a" done
    done_a = next(k for k in ("a-1", "a-2") if sim.state(k) == "memory")
    watch(sim, "c-1")
    [msg] = progress_msgs(sim)
    assert counts(msg) == {"c": (1, 0, 0), "b": (2, 0, 0), "a": (2, 1, 0)}
    assert sim.s.clients["c"].watches[1].left == 4
    assert not sim.ts(done_a).watches


def test_erred_tasks_count_as_erred_and_the_watch_finishes():
    sim = Sim({W1: 2})
    sim.submit(GRAPH, wanted=["sum-1"])
    watch(sim, "sum-1")
    progress_msgs(sim)
    sim.fail("inc-1")
    sim.run_all()
    sim.s.flush_progress()
    [msg] = progress_msgs(sim)
    # once sum-1 erred nothing needs the rest: the watch ends with them unfinished
    assert counts(msg) == {"inc": (3, 0, 1), "double": (2, 0, 1), "sum": (1, 0, 1)}
    assert msg.finished and sim.s.clients["c"].watches == {}


def test_cancelled_tasks_are_counted_as_forgotten():
    sim = Sim({W1: 1})
    sim.submit({"a-1": [], "b-1": ["a-1"]}, wanted=["b-1"])
    watch(sim, "b-1")
    progress_msgs(sim)
    sim.cancel("b-1")
    sim.s.flush_progress()
    [msg] = progress_msgs(sim)
    assert msg.forgotten == 2 and msg.finished


def test_lost_worker_does_not_uncount_and_rerun_finishes_the_watch():
    sim = Sim({W1: 1, W2: 1})
    sim.submit({"a-1": [], "a-2": []})
    watch(sim, "a-1", "a-2")
    progress_msgs(sim)
    sim.remove_worker(sim.worker_of("a-1"))
    sim.s.flush_progress()
    assert progress_msgs(sim) == []  # rescheduled, not finished: no news
    sim.run_all()
    sim.s.flush_progress()
    [msg] = progress_msgs(sim)
    assert counts(msg) == {"a": (2, 2, 0)} and msg.finished


def test_stop_and_client_leaving_close_watches():
    sim = Sim({W1: 1}, clients=("c", "d"))
    sim.submit({"a-1": [], "a-2": []})
    watch(sim, "a-1", watch_id=1)
    watch(sim, "a-2", watch_id=2)
    sim.s.handle_client("c", StopProgress(1, "stop"))
    assert list(sim.s.clients["c"].watches) == [2]
    sim.submit({"x-1": []}, client="d")
    watch(sim, "x-1", client="d")
    sim.s.remove_client("d", "gone")
    progress_msgs(sim)
    sim.run_all()
    sim.s.flush_progress()
    msgs = progress_msgs(sim)
    assert [msg.watch_id for msg in msgs] == [2] and msgs[0].finished
    assert "d" not in sim.comm.clients or not [
        msg for msg in sim.comm.clients["d"] if type(msg) is ProgressCounts and msg.finished
    ]


def test_a_watch_id_used_again_replaces_the_old_watch():
    sim = Sim({W1: 1})
    sim.submit({"a-1": [], "b-1": []})
    watch(sim, "a-1", watch_id=7)
    watch(sim, "b-1", watch_id=7)
    progress_msgs(sim)
    sim.run_all()
    sim.s.flush_progress()
    [msg] = progress_msgs(sim)
    assert counts(msg) == {"b": (1, 1, 0)}


def test_task_groups_newest_first_paged_and_per_prefix():
    sim = Sim({W1: 1})
    sim.submit({f"inc-{i}": [] for i in range(5)} | {"double-0": []})
    groups, total = sim.s.task_groups(limit=3)
    assert total == 6
    assert [g.name for g in groups] == ["double-0", "inc-4", "inc-3"]
    groups, total = sim.s.task_groups("inc", limit=2)
    assert total == 5 and [g.name for g in groups] == ["inc-4", "inc-3"]
    assert groups[0].states == {"released": 1} or set(groups[0].states) <= {
        "processing",
        "queued",
        "waiting",
    }
    assert sim.s.task_groups("nope") == ([], 0)
    assert sim.s.task_groups(limit=0) == ([], 6)
    sim.run_all()
    sim.release("inc-4")
    groups, total = sim.s.task_groups("inc", limit=10)
    assert total == 4 and [g.name for g in groups][0] == "inc-3"
    assert groups[0].states == {"memory": 1} and groups[0].duration_count == 1
