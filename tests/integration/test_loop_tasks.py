"""Tiny tasks run on the worker's event loop (shoal/server/loop_tasks.py): the same
results, errors and tracebacks as on a thread; tasks that wait or run long never do."""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from loop_task_funcs import (
    add_transition_log,
    loop_task_count,
    secede_then_sum,
    tiny_sum_after_get_client,
    tiny_sums_from_a_task,
    transitions_of,
)
from recording_scheduler import on_a_loop_thread
from subprocess_env import child_env

from shoal import Client
from shoal.server.scheduler import Scheduler

pytestmark = pytest.mark.timeout(120)

# (function, arguments): values and errors of the allow-listed functions
CALLS: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
    (sum, ([1, 2, 3],)),
    (sum, ([1.5, 2, True],)),
    (operator.add, ("ab", "cd")),
    (operator.truediv, (7, 2)),
    (max, ([3, 9, 1],)),
    (sorted, ([(2, "b"), (1, "a")],)),
    (operator.getitem, ([10, 20, 30], -1)),
    (tuple, ([1, None],)),
    (sum, ([1, "a"],)),  # TypeError
    (operator.truediv, (1, 0)),  # ZeroDivisionError
    (operator.getitem, ([1], 5)),  # IndexError
    (min, ([],)),  # ValueError
]


@pytest.fixture
def loop_and_threads(spawn: Callable[..., Any]) -> Iterator[Client]:
    """A scheduler, a worker "loop" with tiny tasks on its loop and a worker "threads"
    with them turned off, and a client."""
    with on_a_loop_thread(Scheduler("127.0.0.1", 0), "loop-tasks-scheduler") as s:
        spawn("worker", s.address, "--name", "loop", "--nthreads", "1")
        env = child_env()
        env["SHOAL_WORKER__TINY_TASKS_ON_LOOP"] = "False"
        spawn("worker", s.address, "--name", "threads", "--nthreads", "1", env=env)
        with Client(s.address, timeout=30) as client:
            client.wait_for_workers(2, timeout=30)
            yield client


def counts(client: Client) -> dict[str, int]:
    by_address = client.run(loop_task_count)
    names = {address: w["name"] for address, w in client.scheduler_info()["workers"].items()}
    return {names[address]: n for address, n in by_address.items()}


def outcome(client: Client, func: Callable[..., Any], args: tuple, worker: str) -> Any:
    future = client.submit(func, *args, workers=worker, pure=False)
    error = future.exception(timeout=30)
    if error is None:
        value = future.result()
        return ("value", type(value), value)
    return ("error", type(error), str(error), future.traceback())


def test_results_errors_and_tracebacks_are_the_same_on_the_loop(
    loop_and_threads: Client,
) -> None:
    client = loop_and_threads
    for func, args in CALLS:  # each function loaded by both workers (on a thread)
        outcome(client, func, args, "loop")
        outcome(client, func, args, "threads")
    before = counts(client)
    for func, args in CALLS:
        on_loop = outcome(client, func, args, "loop")
        on_thread = outcome(client, func, args, "threads")
        assert on_loop == on_thread, (func, args)
    after = counts(client)
    assert after["loop"] - before["loop"] == len(CALLS)  # every one ran on the loop
    assert after["threads"] == 0
    assert client.submit(sum, [1, 2, 3], workers="loop", pure=False).result() == 6


def test_a_tiny_task_whose_function_was_never_loaded_runs_on_a_thread(
    loop_and_threads: Client,
) -> None:
    client = loop_and_threads
    before = counts(client)["loop"]
    assert client.submit(abs, -4, workers="loop", pure=False).result(timeout=30) == 4
    assert counts(client)["loop"] == before  # loaded (on its thread) by this run
    assert client.submit(abs, -5, workers="loop", pure=False).result(timeout=30) == 5
    assert counts(client)["loop"] == before + 1


def test_tasks_that_wait_on_tiny_tasks_run_on_threads(loop_and_threads: Client) -> None:
    client = loop_and_threads
    client.submit(sum, [0], workers="loop", pure=False).result(timeout=30)  # sum loaded
    client.submit(operator.add, 0, 0, workers="loop", pure=False).result(timeout=30)
    # A task waits (seceded) on tiny tasks of its own worker, which run on its loop:
    # neither waits on the other.
    before = counts(client)["loop"]
    outer = client.submit(tiny_sums_from_a_task, 20, "loop", workers="loop", pure=False)
    assert outer.result(timeout=60) == list(range(1, 21))
    assert counts(client)["loop"] == before + 20
    # Tasks that call get_client, wait on a future or secede are Python functions: on
    # a thread (on the loop, the wait for an answer the loop must deliver would hang).
    waiting = client.submit(tiny_sum_after_get_client, [1, 2], workers="loop", pure=False)
    assert waiting.result(timeout=60) == 3
    seceded = client.submit(secede_then_sum, [4, 5], workers="loop", pure=False)
    assert seceded.result(timeout=60) == 9


def test_a_long_task_after_many_tiny_ones_leaves_the_loop_free(
    loop_and_threads: Client,
) -> None:
    client = loop_and_threads
    futures = [client.submit(operator.add, i, 1, workers="loop", pure=False) for i in range(50)]
    assert client.gather(futures) == list(range(1, 51))
    assert counts(client)["loop"] >= 49
    # time.sleep is a builtin too, but not on the list: it runs on the thread, and the
    # loop keeps answering meanwhile.
    sleeping = client.submit(time.sleep, 3, workers="loop", pure=False)
    time.sleep(0.5)
    start = time.monotonic()
    counts(client)
    assert time.monotonic() - start < 2.0
    assert not sleeping.done()
    assert sleeping.result(timeout=30) is None


def test_plugins_see_the_same_transitions_on_the_loop(loop_and_threads: Client) -> None:
    client = loop_and_threads
    for worker in ("loop", "threads"):  # functions loaded
        client.submit(sum, [0], workers=worker, pure=False).result(timeout=30)
        client.submit(operator.truediv, 1, 1, workers=worker, pure=False).result(timeout=30)
    client.run(add_transition_log)  # (as a --preload would: the scheduler has no token)
    before = counts(client)["loop"]
    held = []  # (the futures are held until the transitions are compared)
    for worker in ("loop", "threads"):
        good = client.submit(sum, [1, 2], workers=worker, key=f"good-{worker}")
        bad = client.submit(operator.truediv, 1, 0, workers=worker, key=f"bad-{worker}")
        assert good.result(timeout=30) == 3
        assert isinstance(bad.exception(timeout=30), ZeroDivisionError)
        held += [good, bad]
    assert counts(client)["loop"] == before + 2
    names = {address: w["name"] for address, w in client.scheduler_info()["workers"].items()}
    seen = {names[a]: t for a, t in client.run(transitions_of).items()}
    for kind in ("good", "bad"):
        on_loop, on_thread = seen["loop"][f"{kind}-loop"], seen["threads"][f"{kind}-threads"]
        assert on_loop == on_thread, kind
        assert ("ready", "executing") in on_loop
