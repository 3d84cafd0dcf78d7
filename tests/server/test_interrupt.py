"""TaskThreads (shoal/server/interrupt.py) on real threads: an interrupt reaches the
thread running that very task, skips a task not started yet, and never reaches a
thread's next task."""

from __future__ import annotations

import threading
import time
from typing import Any

from shoal import TaskInterrupted
from shoal.server.interrupt import TaskThreads, ThreadSlot


def run_in_thread(threads: TaskThreads, key: Any, mark: list[bool], body: Any) -> dict[str, Any]:
    """Run ``body`` as task ``key`` the way a worker thread does; what happened."""
    out: dict[str, Any] = {}

    def target() -> None:
        slot = ThreadSlot()
        try:
            try:
                if not threads.start(key, mark, slot):
                    raise TaskInterrupted("cancelled before it started")
                out["result"] = body(out)
            except TaskInterrupted:
                out["interrupted"] = True
            out["late"] = threads.end(key, slot)
            time.sleep(0.02)  # an interrupt aimed at the task must not land here
            out["after"] = "clean"
        except TaskInterrupted:
            out["after"] = "hit after its task ended"

    t = threading.Thread(target=target)
    t.start()
    out["thread"] = t
    return out


def spin(out: dict[str, Any]) -> None:
    out["started"] = True
    while True:
        pass


def test_a_running_python_loop_is_interrupted():
    threads = TaskThreads()
    mark = threads.queued("a")
    out = run_in_thread(threads, "a", mark, spin)
    deadline = time.monotonic() + 10
    while not out.get("started"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert threads.interrupt("a") == "running"
    out["thread"].join(10)
    assert out.get("interrupted") and out["after"] == "clean"


def test_a_queued_task_is_skipped():
    threads = TaskThreads()
    mark = threads.queued("a")
    assert threads.interrupt("a") == "queued"
    out = run_in_thread(threads, "a", mark, lambda out: "ran")
    out["thread"].join(10)
    assert out.get("interrupted") and "result" not in out and out["after"] == "clean"


def test_an_interrupt_after_the_task_ended_reaches_nothing():
    threads = TaskThreads()
    mark = threads.queued("a")
    out = run_in_thread(threads, "a", mark, lambda out: "ran")
    time.sleep(0.05)  # the task is over, its thread sleeps on
    assert threads.interrupt("a") == ""
    out["thread"].join(10)
    assert out["result"] == "ran" and out["after"] == "clean" and not out["late"]


def test_interrupts_racing_the_end_of_tasks_never_reach_past_them():
    """Interrupts fired at random moments around tasks that end on their own: each
    lands in its task, or in end() (reported late), or not at all; never later."""
    import random

    rng = random.Random(0)
    threads = TaskThreads()
    for i in range(150):
        budget = rng.uniform(0, 0.004)

        def busy(out: dict[str, Any], budget: float = budget) -> str:
            deadline = time.perf_counter() + budget
            while time.perf_counter() < deadline:
                pass
            return "ran"

        mark = threads.queued(i)
        out = run_in_thread(threads, i, mark, busy)
        time.sleep(rng.uniform(0, 0.005))
        threads.interrupt(i)
        out["thread"].join(10)
        assert out["after"] == "clean", (i, out)
        assert ("result" in out) != bool(out.get("interrupted")), (i, out)
