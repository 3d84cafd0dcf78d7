"""Where the milliseconds of a small notebook compute go in shoal (issue 16's groundwork).

Starts one shoal scheduler and two one-thread workers (``benchmarks/cluster.py``) and
runs each cell many times, alternating, run by run:

* ``sync``: ``coll.compute(scheduler="sync")``, the local baseline;
* ``shoal``: ``client.compute(coll, sync=True)``, the real path end to end;
* ``phased``: the same path taken apart step by step (a copy of
  ``shoal/client/graph/collections.py``'s ``compute`` and ``submit_graph``), each step timed:
  Dask's optimisation, materialisation, cull and checks, ``dask.order``, shoal's
  topological pass, encoding, the submit call, waiting for the results to be done
  (scheduler and workers), and the gather.

With ``--trace DIR`` it then starts a second cluster whose processes (and this one)
write every frame to ``DIR`` (see ``benchmarks/message_trace.py``), runs each cell
a few times, and prints the messages of one compute: who sent what to whom, when,
relative to the ``compute()`` call, and the worker's own start/stop of each task.

    PYTHONPATH=. python benchmarks/profile_interactive.py --repeats 30
    PYTHONPATH=. python benchmarks/profile_interactive.py --cells merge --repeats 3 \\
        --trace artifacts/trace
    PYTHONPATH=. python benchmarks/profile_interactive.py --cells merge --loop 60
        # runs only phased merges for 60 s (attach py-spy to the printed pids)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import message_trace
from benchmarks.cluster import SYSTEMS, Cluster, cpu_delta

PHASES = (
    "optimize",  # collections_to_expr + FinalizeCompute(...).optimize()
    "materialize",  # expr.__dask_graph__ + convert_legacy_graph
    "cull_check",  # cull, shuffle marks, check_graph
    "order",  # dask.order.order
    "topological",  # shoal's dependency-first pass over the order
    "encode",  # annotations + GraphEncoder.task_spec per task
    "submit",  # Client._submit_parts: the SubmitTasks message queued
    "run",  # until every future is done: scheduler, workers, messages
    "gather",  # client.gather (inline results: no fetch)
)
# Not a phase of shoal's: the graph's tasks run one after another in this process
# (what "run" would cost with no scheduler, no workers and no messages).
LOCAL = "tasks_local"


# ----------------------------------------------------------------------------- cells


def make_cells(rows: int) -> dict[str, Callable[[], Any]]:
    """Each cell builds its collection anew, as a notebook cell run again does."""
    import dask
    import dask.array as da
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    from benchmarks.interactive import matmul_cell  # the same array as the benchmark's

    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"a": rng.integers(0, 100, rows), "b": rng.random(rows)})
    df = dd.from_pandas(pdf, npartitions=4)
    small = pd.DataFrame({"a": np.arange(100), "c": rng.random(100)})
    return {
        "sum": lambda: df.b.sum(),
        "groupby": lambda: df.groupby("a").b.mean(),
        "merge": lambda: df.merge(small, on="a"),
        "array": lambda: da.ones((1000, 1000), chunks=250).sum(),
        "delayed": lambda: dask.delayed(sum)([1, 2, 3]),
        "matmul": matmul_cell,
    }


# ----------------------------------------------------------------------------- phases


def phased_compute(client: Any, coll: Any) -> tuple[Any, dict[str, float], int]:
    """``client.compute(coll, sync=True)`` step by step: (value, seconds per phase,
    tasks). Mirrors shoal/client/graph/collections.py (compute, submit_graph)."""
    import dask
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr
    from dask.order import order

    import shoal
    from shoal.client.graph import collections as coll_mod
    from shoal.client.graph.collections import materialize  # the client's own (blockwise_expand)
    from shoal.client.graph.dask_graph import (
        annotations_for,
        check_graph,
        cull,
        topological,
    )
    from shoal.shuffle import _dask as shuffle_dask

    times: dict[str, float] = {}
    clock = time.perf_counter
    t = clock()

    def lap(name: str) -> None:
        nonlocal t
        now = clock()
        times[name] = now - t
        t = now

    shuffle_dask.install()
    with shuffle_dask.computing():
        expr = FinalizeCompute(collections_to_expr([coll], True)).optimize()
    keys = list(coll_mod._flatten(expr.__dask_keys__()))
    lap("optimize")
    with shuffle_dask.computing():
        dsk, by_type = materialize(expr)
    lap("materialize")
    dsk = cull(dsk, keys)
    marks = shuffle_dask.shuffle_marks(dsk)
    check_graph(dsk, client._states.__contains__)
    lap("cull_check")
    priorities = order(dsk) if dsk else {}
    lap("order")
    ordered = topological(dsk, priorities)
    lap("topological")
    defaults = {**dask.get_annotations()}
    encoder = client._graph_encoder()
    specs = []
    for key in ordered:
        annots = annotations_for(key, by_type, defaults)
        spec = encoder.task_spec(key, dsk[key], priority=int(annots.get("priority", 0)), retries=0)
        if marks:
            spec.shuffle = marks.get(key)
        specs.append(spec)
    lap("encode")
    futures = client._submit_parts(iter((specs,)), keys)
    lap("submit")
    shoal.wait(futures)
    lap("run")
    values = client.gather(futures)
    lap("gather")
    del futures
    cache: dict[Any, Any] = {}
    t = clock()
    for key in ordered:
        cache[key] = dsk[key](cache)
    times[LOCAL] = clock() - t
    return values[0], times, len(specs)


# ----------------------------------------------------------------------------- runs


@dataclass
class CellResult:
    name: str
    tasks: int = 0
    sync: list[float] = field(default_factory=list)
    shoal: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(
        default_factory=lambda: {"client": [], "scheduler": [], "workers": []}
    )  # CPU seconds per real compute, its release messages included
    phases: dict[str, list[float]] = field(
        default_factory=lambda: {p: [] for p in (*PHASES, LOCAL)}
    )


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


def _settle(seconds: float) -> None:
    """Let the last compute's release messages go by before the next one is timed."""
    time.sleep(seconds)


def _same(a: Any, b: Any) -> bool:
    import numpy as np
    import pandas as pd

    if isinstance(a, pd.Series):
        a, b = a.to_frame(), b.to_frame()
    if isinstance(a, pd.DataFrame):
        a = a.sort_values(list(a.columns)).reset_index(drop=True)
        b = b.sort_values(list(b.columns)).reset_index(drop=True)
        return bool(a.equals(b)) or bool(np.allclose(a.to_numpy(), b.to_numpy()))
    return bool(np.allclose(a, b))


def idle_cpu_rates(cluster: Cluster, seconds: float = 2.0) -> dict[str, float]:
    """CPU seconds per second each side spends with nothing to do."""
    _settle(0.5)
    before, c0, w0 = cluster.cpu_snapshot(), time.process_time(), time.perf_counter()
    time.sleep(seconds)
    c1, w1 = time.process_time(), time.perf_counter()
    after = cluster.cpu_snapshot()
    wall = w1 - w0
    return {
        "client": (c1 - c0) / wall,
        "scheduler": cpu_delta(before[0], after[0])[0] / wall,
        "workers": cpu_delta(before[1], after[1])[0] / wall,
    }


def run_cells(
    cluster: Cluster, cells: dict[str, Callable[[], Any]], repeats: int, settle: float
) -> tuple[list[CellResult], dict[str, float]]:
    """Each cell's timings, and the idle CPU rates taken off its CPU figures."""
    client = cluster.client
    background = idle_cpu_rates(cluster)
    results = []
    for name, make in cells.items():
        res = CellResult(name)
        expected = make().compute(scheduler="sync")
        for _ in range(2):  # warm up: imports, function tables, connections
            client.compute(make(), sync=True)
            phased_compute(client, make())
        _settle(settle)
        for i in range(repeats):
            # Alternate which goes first, so a shared machine's load falls on all alike.
            order = ("sync", "shoal", "phased") if i % 2 == 0 else ("phased", "shoal", "sync")
            for what in order:
                coll = make()
                gc.collect()
                if what == "sync":
                    value, dt = _timed(lambda c=coll: c.compute(scheduler="sync"))
                    res.sync.append(dt)
                elif what == "shoal":
                    before, c0, w0 = (
                        cluster.cpu_snapshot(),
                        time.process_time(),
                        time.perf_counter(),
                    )
                    value, dt = _timed(lambda c=coll: client.compute(c, sync=True))
                    res.shoal.append(dt)
                    _settle(settle)
                    c1, w1 = time.process_time(), time.perf_counter()
                    after = cluster.cpu_snapshot()
                    # less what the processes spend anyway (heartbeats, monitors)
                    window = w1 - w0
                    res.cpu["client"].append(c1 - c0 - background["client"] * window)
                    for i, side in enumerate(("scheduler", "workers")):
                        spent = cpu_delta(before[i], after[i])[0]
                        res.cpu[side].append(spent - background[side] * window)
                else:
                    value, times, res.tasks = phased_compute(client, coll)
                    for phase, seconds in times.items():
                        res.phases[phase].append(seconds)
                if not _same(value, expected):
                    raise AssertionError(f"{name}: {what} gave a wrong result")
                del value
                _settle(settle)
        results.append(res)
        print(f"{name}: done", file=sys.stderr)
    return results, background


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3 if xs else float("nan")


def table(results: list[CellResult]) -> str:
    head = ["cell", "tasks", "sync ms", "shoal ms", "ratio", *PHASES, "sum of phases", LOCAL]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        phases = [median_ms(r.phases[p]) for p in PHASES]
        sync, real = median_ms(r.sync), median_ms(r.shoal)
        row = [r.name, str(r.tasks), f"{sync:.1f}", f"{real:.1f}", f"{real / sync:.2f}x"]
        row += [f"{x:.2f}" for x in phases] + [f"{sum(phases):.1f}"]
        row.append(f"{median_ms(r.phases[LOCAL]):.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def cpu_table(results: list[CellResult]) -> str:
    """CPU ms per real compute in each process (medians, less their idle rate), against
    the sync run's wall time."""
    head = ["cell", "sync ms", "client CPU ms", "scheduler CPU ms", "workers CPU ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        row = [r.name, f"{median_ms(r.sync):.1f}"]
        row += [f"{median_ms(r.cpu[p]):.1f}" for p in ("client", "scheduler", "workers")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- A/B


def experiments(client: Any, rows: int) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Pairs (as it is, without one cost) that bound what a fix of section 3 of
    PROFILE-interactive.md could save, measured end to end without changing shoal."""
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"a": rng.integers(0, 100, rows), "b": rng.random(rows)})
    df = dd.from_pandas(pdf, npartitions=4)
    import shoal

    held = client.persist(df)  # the partitions already on the workers
    shoal.wait(client.futures_of(held))
    return {
        # a float64 result is fetched (WhoHas + GetData); a float rides with KeyInMemory
        "result np.float64 vs float": (
            lambda: client.submit(np.float64, 1.5, pure=False).result(),
            lambda: client.submit(float, 1.5, pure=False).result(),
        ),
        # the frame's partitions travel in the graph vs already held by the workers
        "df.b.sum(): data in graph vs persisted": (
            lambda: client.compute(df.b.sum(), sync=True),
            lambda: client.compute(held.b.sum(), sync=True),
        ),
        # the graph as dask.compute makes it (13 tasks) vs fused first (9 tasks)
        "df.b.sum(): unfused vs fused": (
            lambda: client.compute(df.b.sum(), sync=True),
            lambda: client.compute(df.b.sum().optimize(), sync=True),
        ),
    }


def run_experiments(client: Any, rows: int, repeats: int, settle: float) -> str:
    head = ["pair", "as it is ms", "without the cost ms", "difference ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, (base, lean) in experiments(client, rows).items():
        times: dict[int, list[float]] = {0: [], 1: []}
        for i in range(repeats + 2):
            pair = ((0, base), (1, lean)) if i % 2 == 0 else ((1, lean), (0, base))
            for which, fn in pair:
                gc.collect()
                _, dt = _timed(fn)
                if i >= 2:  # the first two rounds warm up
                    times[which].append(dt)
                _settle(settle)
        a, b = median_ms(times[0]), median_ms(times[1])
        lines.append(f"| {name} | {a:.2f} | {b:.2f} | {a - b:.2f} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- trace


def _role_names(lines: list[dict[str, Any]]) -> dict[str, str]:
    """Local address -> 'scheduler' / 'worker-<pid>' / 'client'."""
    names: dict[str, str] = {}
    for line in lines:
        role = line["role"] if line["role"] != "worker" else f"worker-{line['pid']}"
        names.setdefault(line["local"], role)
    return names


def _peer_name(peer: str, names: dict[str, str]) -> str:
    host_port = peer.split("://")[-1]
    return names.get(host_port, peer)


def print_trace(lines: list[dict[str, Any]], t0: float, t1: float, out: Any) -> None:
    names = _role_names(lines)
    window = [x for x in lines if t0 <= x["t"] <= t1 + 0.005]
    for line in window:
        who = line["role"] if line["role"] != "worker" else f"worker-{line['pid']}"
        arrow = "->" if line["dir"] == "out" else "<-"
        peer = _peer_name(line["peer"], names)
        msgs = ", ".join(_fmt_msg(m, t0) for m in line["msgs"]) or line.get("note", "")
        print(f"{(line['t'] - t0) * 1e3:8.2f} ms  {who:>14} {arrow} {peer:<14} {msgs}", file=out)


def _fmt_msg(msg: dict[str, Any], t0: float) -> str:
    text = msg["type"]
    extra = []
    if "key" in msg:
        extra.append(msg["key"][:40])
    for name in ("tasks", "keys", "wanted"):
        if name in msg:
            extra.append(f"{name}={msg[name]}")
    if "start" in msg and "stop" in msg:
        extra.append(f"ran {(msg['start'] - t0) * 1e3:.2f}..{(msg['stop'] - t0) * 1e3:.2f} ms")
    if "payload_bytes" in msg:
        extra.append(f"{msg['payload_bytes']} B")
    return f"{text}({'; '.join(extra)})" if extra else text


def trace_stats(lines: list[dict[str, Any]]) -> dict[str, tuple[float, float, int]]:
    """Medians over a trace (ms): (median, p90, count) of

    * ``wire``: a frame's write to its dispatch at the other end (one hop; it
      includes the receiver's loop picking it up and decoding it);
    * ``worker: ComputeTask in -> task start``: the hand-off to a task thread and the
      wait behind the worker's earlier tasks;
    * ``worker: task stop -> TaskFinished out``: the hand-off back to the loop;
    * ``worker: task stop -> next task start``: a one-thread worker's gap between
      two tasks while it had the next one already;
    * ``scheduler: TaskFinished in -> next ComputeTask out``: its reaction."""
    sent: dict[tuple[str, str, str], float] = {}
    stats: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        stats.setdefault(name, []).append(seconds * 1e3)

    arrived: dict[tuple[int, str], float] = {}  # (worker pid, key) -> ComputeTask in
    last_stop: dict[int, float] = {}
    finished_in: float | None = None
    for line in lines:
        for msg in line["msgs"]:
            ident = (msg["type"], msg.get("key", ""), str(msg.get("keys", "")))
            if line["dir"] == "out":
                sent[ident] = line["t"]
            elif ident in sent:
                add("wire (frame out -> dispatched at the peer)", line["t"] - sent.pop(ident))
        kinds = {m["type"] for m in line["msgs"]}
        if line["role"] == "worker":
            pid = line["pid"]
            for msg in line["msgs"]:
                if line["dir"] == "in" and msg["type"] == "ComputeTask":
                    arrived[(pid, msg["key"])] = line["t"]
                if line["dir"] == "out" and msg["type"] == "TaskFinished":
                    got = arrived.pop((pid, msg["key"]), None)
                    if got is not None and msg["start"] >= got:
                        add("worker: ComputeTask in -> task start", msg["start"] - got)
                    add("worker: task stop -> TaskFinished out", line["t"] - msg["stop"])
                    prev = last_stop.get(pid)
                    if prev is not None and got is not None and got < prev < msg["start"]:
                        add(
                            "worker: task stop -> next task start (next one waiting)",
                            msg["start"] - prev,
                        )
                    last_stop[pid] = msg["stop"]
        elif line["role"] == "scheduler":
            if line["dir"] == "in" and "SubmitTasks" in kinds:  # another compute begins
                finished_in = None
            elif line["dir"] == "in" and "TaskFinished" in kinds:
                finished_in = line["t"]
            elif line["dir"] == "out" and "ComputeTask" in kinds and finished_in is not None:
                add("scheduler: TaskFinished in -> next ComputeTask out", line["t"] - finished_in)
                finished_in = None
    out = {}
    for name, xs in stats.items():
        xs.sort()
        out[name] = (statistics.median(xs), xs[int(0.9 * (len(xs) - 1))], len(xs))
    return out


def run_trace(
    cells: dict[str, Callable[[], Any]], directory: Path, repeats: int, via_get: bool = False
) -> None:
    import dask

    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("trace-*.jsonl"):
        old.unlink()
    site = directory / "site"
    message_trace.write_sitecustomize(site)
    os.environ[message_trace.ENV] = str(directory)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(site), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    message_trace.install(directory / f"trace-{os.getpid()}.jsonl", "client")
    cluster = Cluster(SYSTEMS["shoal"]).start()
    try:
        client = cluster.client
        marks = []
        for name, make in cells.items():
            for _ in range(repeats):
                t0 = time.time()
                if via_get:  # the notebook's path: the client as Dask's scheduler
                    with dask.config.set(scheduler=client.get):
                        make().compute()
                else:
                    client.compute(make(), sync=True)
                t1 = time.time()
                _settle(0.2)
            marks.append((name, t0, t1))  # the last compute of the cell
        time.sleep(0.5)
    finally:
        cluster.stop()
    lines = message_trace.read_trace(directory)
    print("\n### Hops over the whole traced run (ms; the trace itself adds to each)\n")
    print("| hop | median | p90 | count |\n|---|---|---|---|")
    for hop, (med, p90, n) in trace_stats(lines).items():
        print(f"| {hop} | {med:.3f} | {p90:.3f} | {n} |")
    for name, t0, t1 in marks:
        print(f"\n### {name}: one compute, {(t1 - t0) * 1e3:.2f} ms (traced)\n")
        print("```")
        print_trace(lines, t0, t1, sys.stdout)
        print("```")


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", default="sum,groupby,merge,array,delayed")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the dataframe")
    parser.add_argument("--settle", type=float, default=0.05, help="seconds between computes")
    parser.add_argument("--trace", type=Path, default=None, help="also trace messages here")
    parser.add_argument("--trace-repeats", type=int, default=3)
    parser.add_argument(
        "--trace-via",
        choices=("compute", "get"),
        default="compute",
        help="trace client.compute(coll, sync=True), or coll.compute() with the client as "
        "Dask's scheduler (its get: the interactive benchmark's path)",
    )
    parser.add_argument(
        "--loop",
        type=float,
        default=0.0,
        help="only run phased computes of the cells for this many seconds",
    )
    parser.add_argument("--json", type=Path, default=None, help="write raw timings here")
    parser.add_argument(
        "--experiments", action="store_true", help="also run the A/B pairs (same repeats)"
    )
    args = parser.parse_args(argv)

    all_cells = make_cells(args.rows)
    names = [n.strip() for n in args.cells.split(",") if n.strip()]
    unknown = [n for n in names if n not in all_cells]
    if unknown:
        parser.error(f"unknown cell(s) {unknown}; known: {', '.join(all_cells)}")
    cells = {n: all_cells[n] for n in names}

    cluster = Cluster(SYSTEMS["shoal"]).start()
    try:
        assert cluster.scheduler_proc is not None
        pids = [cluster.scheduler_proc.pid, *(p.pid for p in cluster.worker_procs)]
        print(
            f"pids: client {os.getpid()} scheduler {pids[0]} workers {pids[1]} {pids[2]}",
            file=sys.stderr,
            flush=True,
        )
        if args.loop:
            deadline = time.monotonic() + args.loop
            n = 0
            while time.monotonic() < deadline:
                for make in cells.values():
                    phased_compute(cluster.client, make())
                    n += 1
            print(f"{n} computes in {args.loop:g} s", file=sys.stderr)
            return 0
        results, background = run_cells(cluster, cells, args.repeats, args.settle)
        ab = (
            run_experiments(cluster.client, args.rows, args.repeats, args.settle)
            if args.experiments
            else ""
        )
    finally:
        with contextlib.suppress(Exception):
            cluster.stop()
    print(f"median of {args.repeats}; load average {os.getloadavg()}\n")
    print(table(results))
    print()
    print(cpu_table(results))
    idle = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in background.items())
    print(f"\nIdle CPU taken off (ms per s): {idle}")
    if ab:
        print(f"\nA/B, median of {args.repeats}, alternating:\n")
        print(ab)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    if args.trace:
        run_trace(cells, args.trace, args.trace_repeats, args.trace_via == "get")
    return 0


if __name__ == "__main__":
    sys.exit(main())
