"""Where the fixed cost of one compute goes: a timeline of a one-task graph across the
client, the scheduler and the worker (not part of shoal).

Every process stamps ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux: one clock for
all the processes of a machine) at a few points of a compute's path, in memory, and
writes them out when it ends; the children get the stamps through a ``sitecustomize``
module on their ``PYTHONPATH`` (as ``message_trace`` does). Each stamp costs about a
microsecond; the medians below are per compute, of the time since ``compute()`` was
called, and the step from the stamp before.

    PYTHONPATH=. python benchmarks/fixed_cost.py [--computes 300] [--pause 0.01] [--lanes]

The compute goes through the scheduler (the client's lanes off, ``shoal/lanes``), whose
path the points below describe; with ``--lanes`` it goes by lane, straight to a worker.

Points: the client's ``compute()`` call, shoal's ``get`` (what Dask calls), the graph
submitted (``submit_graph`` done), every frame written (``wr0``/``wr1``, around the
write) and dispatched (``in``) in each process, the scheduler's handling of a client
batch, the worker handing the task to its thread (``exec``), the task thread running it
(``run``), the result handed back to the loop (``pushed``, ``drain``), the caller woken
(``woke``) and ``compute()`` returning.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ENV = "SHOAL_FIXED_COST_DIR"

_SITECUSTOMIZE = """\
import os, sys
if os.environ.get({env!r}):
    try:
        from benchmarks.fixed_cost import install
        install()
    except Exception as e:  # stamps must never stop the process
        print("fixed-cost stamps not installed:", repr(e), file=sys.stderr)
"""

_stamps: list[tuple[float, str]] = []


def stamp(event: str) -> None:
    _stamps.append((time.perf_counter(), event))


def _role() -> str:
    for name in ("scheduler", "worker"):
        if name in sys.argv[1:3]:
            return name
    return "client"


def dump() -> None:
    directory = os.environ.get(ENV)
    if not directory or not Path(directory).is_dir():  # (the run's reader removed it)
        return
    path = Path(directory) / f"{_role()}-{os.getpid()}.txt"
    path.write_text("".join(f"{t:.7f} {event}\n" for t, event in _stamps))


def _wrap(owner: Any, name: str, label: str) -> None:
    inner = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        stamp(label + "0")
        try:
            return inner(*args, **kwargs)
        finally:
            stamp(label + "1")

    setattr(owner, name, wrapped)


def install() -> None:
    """Stamp this process's points (see the module's docstring); dump them at exit."""
    import atexit
    import signal

    from shoal.comm import connection

    atexit.register(dump)
    dispatch = connection.Connection._dispatch

    def stamped_dispatch(self: Any, frame: Any) -> None:
        stamp("in " + ",".join(type(msg).__name__ for msg in frame.messages[:3]))
        dispatch(self, frame)

    connection.Connection._dispatch = stamped_dispatch  # type: ignore[method-assign]
    _wrap(connection.Connection, "_write", "wr")
    _wrap(connection.Connection, "write_direct", "wd")  # a caller's thread writing itself
    role = _role()
    if role == "worker":
        from shoal.server import task_thread, worker

        _wrap(task_thread.TaskThreadMixin, "_run_one", "run")
        _wrap(worker.Worker, "_execute", "exec")
        _wrap(worker.Worker, "_drain_results", "drain")
        push = worker.Worker._push_result

        def stamped_push(self: Any, event: Any) -> None:
            push(self, event)
            stamp("pushed")

        worker.Worker._push_result = stamped_push  # type: ignore[method-assign]
    elif role == "scheduler":
        from shoal.server import scheduler

        _wrap(scheduler.Scheduler, "_client_batch", "batch")
    if role != "client":

        def on_term(*_: Any) -> None:
            dump()
            os._exit(0)

        signal.signal(signal.SIGTERM, on_term)


def read(directory: Path) -> list[tuple[float, str, str]]:
    events = []
    for path in directory.glob("*.txt"):
        role, pid = path.stem.split("-")
        for line in path.read_text().splitlines():
            t, event = line.split(" ", 1)
            events.append((float(t), f"{role}-{pid}" if role == "worker" else role, event))
    events.sort()
    return events


def timeline(
    events: list[tuple[float, str, str]], skip: int
) -> list[tuple[float, float, str, int]]:
    """(median ms since compute(), median step ms, point, count) for the points seen in
    most computes, in time order."""
    computes: list[list[tuple[float, str, str]]] = []
    for event in events:
        if event[1] == "client" and event[2] == "compute0":
            computes.append([event])
        elif computes:
            computes[-1].append(event)
    computes = computes[skip:]
    workers = {role for c in computes for _, role, _ in c if role.startswith("worker")}
    names = {role: f"worker{i}" for i, role in enumerate(sorted(workers))}
    at: dict[str, list[float]] = defaultdict(list)
    steps: dict[str, list[float]] = defaultdict(list)
    for compute in computes:
        t0 = prev = compute[0][0]
        seen: Counter[str] = Counter()
        for t, role, event in compute:
            point = f"{names.get(role, role)}: {event}"
            seen[point] += 1
            point += f" #{seen[point]}" if seen[point] > 1 else ""
            at[point].append((t - t0) * 1e3)
            steps[point].append((t - prev) * 1e3)
            prev = t
            if role == "client" and event == "compute1":
                break
    rows = [
        (statistics.median(at[p]), statistics.median(steps[p]), p, len(at[p]))
        for p in at
        if len(at[p]) >= 0.5 * len(computes)
    ]
    return sorted(rows)


class _DroppingComm:
    """A scheduler core's comm that drops every message (the hot loop times the core)."""

    def send_worker(self, address: str, msg: Any) -> None:
        pass

    def send_client(self, client_id: str, msg: Any) -> None:
        pass


def hot_steps(repeat: int = 5_000) -> list[tuple[str, float]]:
    """Median µs of a few steps of a one-task compute's path, run in a loop in this
    process (hot caches, no wake-up between them), to set beside the timeline."""
    import uuid

    from shoal.core.scheduler.state import SchedulerState
    from shoal.protocol import messages as m
    from shoal.protocol.framing import FrameDecoder, encode_frame

    state = SchedulerState(_DroppingComm())  # type: ignore[arg-type]
    state.add_client("c")
    for address in ("tcp://w1:1", "tcp://w2:1"):
        state.add_worker(address, address, 1, 2**30, "add-w")
    args = m.Payload(0, b"\x92\x90\x80")  # msgpack: ([], {})
    state.handle_client("c", m.SubmitTasks([], [], {"f": b"a function"}, "functions"))
    times: dict[str, list[int]] = {"submit": [], "finished": [], "release": []}
    clock = time.perf_counter_ns
    for i in range(repeat + 500):
        key = f"sum-{uuid.uuid4()}"
        t0 = clock()
        state.handle_client("c", m.SubmitTasks([m.TaskSpec(key, "f", args, [])], [key], {}, "s"))
        t1 = clock()
        worker = state.tasks[key].processing_on
        assert worker is not None
        t2 = clock()
        done = m.TaskFinished(key, 28, 1.0, 1.1, m.Payload(0, b"\x06"), "int", "f")
        state.handle_worker(worker.address, done)
        t3 = clock()
        state.handle_client("c", m.ReleaseKeys([key], "r"))
        t4 = clock()
        if i >= 500:  # (the first ones warm up)
            times["submit"].append(t1 - t0)
            times["finished"].append(t3 - t2)
            times["release"].append(t4 - t3)
    msg = m.KeyInMemory("sum-" + "0" * 36, m.Payload(0, b"\x06"), "int", "task-finished-1")
    (frame,) = encode_frame([msg])
    decoder = FrameDecoder()
    decode = []
    for _ in range(repeat):
        t0 = clock()
        view = decoder.get_buffer()
        view[: len(frame)] = frame
        decoder.buffer_updated(len(frame))
        decode.append(clock() - t0)
    return [
        (
            "scheduler core: a one-task SubmitTasks (placed, ComputeTask made)",
            _median_us(times["submit"]),
        ),
        ("scheduler core: its TaskFinished (KeyInMemory made)", _median_us(times["finished"])),
        ("scheduler core: its ReleaseKeys", _median_us(times["release"])),
        (f"a {len(frame)}-byte KeyInMemory frame decoded", _median_us(decode)),
    ]


def _median_us(ns: list[int]) -> float:
    return statistics.median(ns) / 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--computes", type=int, default=300)
    parser.add_argument("--pause", type=float, default=0.01, help="seconds between computes")
    parser.add_argument(
        "--hot", action="store_true", help="also time a few of the steps in a loop, hot"
    )
    parser.add_argument("--lanes", action="store_true", help="one-task gets by lane")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="fixed-cost-"))
    site = directory / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(env=ENV))
    root = str(Path(__file__).resolve().parent.parent)
    os.environ[ENV] = str(directory)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), root, *paths])
    install()

    import dask

    from benchmarks.cluster import SYSTEMS, Cluster
    from shoal.client import futures
    from shoal.client.graph import collections

    _wrap(collections, "get", "get")
    _wrap(collections, "submit_graph", "submit_graph")
    wait_sync = futures.FutureState.wait_sync

    def stamped_wait(self: Any, timeout: float | None) -> bool:
        done = wait_sync(self, timeout)
        stamp("woke")
        return done

    futures.FutureState.wait_sync = stamped_wait  # type: ignore[method-assign]
    cluster = Cluster(SYSTEMS["shoal"]).start()
    load = os.getloadavg()
    try:
        client = cluster.client
        client._lanes.enabled = args.lanes

        def run() -> None:
            with dask.config.set(scheduler=client.get):
                for _ in range(args.computes):
                    cell = dask.delayed(sum)([1, 2, 3])
                    stamp("compute0")
                    assert cell.compute() == 6
                    stamp("compute1")
                    time.sleep(args.pause)

        cluster.call(run, timeout=60 + args.computes)
    finally:
        cluster.stop()
    dump()
    skip = min(20, args.computes // 10)
    rows = timeline(read(directory), skip)
    shutil.rmtree(directory, ignore_errors=True)
    print(f"# delayed(sum)([1, 2, 3]).compute(), {args.computes - skip} computes; load {load}")
    print("| ms since compute() | step ms | point | count |\n|---|---|---|---|")
    for when, step, point, count in rows:
        print(f"| {when:.3f} | {step:.3f} | {point} | {count} |")
    if args.hot:
        print("\n# The same steps in a loop in this process (hot): median µs")
        print("| step | µs |\n|---|---|")
        for what, us in hot_steps():
            print(f"| {what} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
