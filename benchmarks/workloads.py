"""Task functions and workloads.

The task functions (``inc``, ``add``, ``sum_list``) live in this importable module
(``benchmarks.workloads``) so that both shoal and Dask pickle them *by reference*;
the worker processes get the repository root on ``PYTHONPATH`` to import them.

Each workload is written once against the common client API
(``client.submit``, ``client.map``, ``future.result``, ``client.gather`` and the
module-level ``wait``) and runs unchanged against shoal and Dask.  A workload
returns an :class:`Outcome`; everything inside the workload call is timed, while
``Outcome.verify`` runs after the clocks stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# --- task functions (executed on the workers) ----------------------------------------


def inc(x):
    return x + 1


def add(a, b):
    return a + b


def sum_list(xs):
    return sum(xs)


# --- workloads ------------------------------------------------------------------------


@dataclass
class Api:
    """What a workload needs from one system besides the client itself."""

    wait: Callable[..., Any]
    map_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"pure": False}
    check: bool = True  # verify results (False for zero workers: results are None)


@dataclass
class Outcome:
    samples: list[float] | None = None  # per-call seconds (latency workload)
    verify: Callable[[], None] | None = None  # run after timing; raises on a wrong result
    keep: Any = None  # futures to keep alive until verification is done


def _expect(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: expected {want!r}, got {got!r}")


def latency(api: Api, client, n: int) -> Outcome:
    """n sequential round trips: submit one task and wait for its result."""
    samples = []
    results = []
    for i in range(n):
        t0 = time.perf_counter()
        r = client.submit(inc, i, pure=False).result()
        samples.append(time.perf_counter() - t0)
        results.append(r)

    def verify():
        _expect(results, [i + 1 for i in range(n)], "latency results")

    return Outcome(samples=samples, verify=verify if api.check else None)


def map_(api: Api, client, n: int) -> Outcome:
    """n independent tasks submitted with one client.map call."""
    futs = client.map(inc, range(n), **api.map_kwargs)
    api.wait(futs)

    def verify():
        _expect(client.gather([futs[0], futs[-1]]), [1, n], "map results")

    return Outcome(verify=verify if api.check else None, keep=futs)


def merge(api: Api, client, n: int) -> Outcome:
    """n independent tasks, then one task taking all of them as a single list."""
    futs = client.map(inc, range(n), **api.map_kwargs)
    total = client.submit(sum_list, futs, pure=False)
    result = total.result()

    def verify():
        _expect(result, n * (n + 1) // 2, "merge result")

    return Outcome(verify=verify if api.check else None, keep=(futs, total))


def tree(api: Api, client, depth: int) -> Outcome:
    """Pairwise ``add`` reduction of 2**depth ``inc`` leaves (2**(depth+1) - 1 tasks)."""
    n = 2**depth
    layer = client.map(inc, range(n), **api.map_kwargs)
    while len(layer) > 1:
        layer = [
            client.submit(add, layer[i], layer[i + 1], pure=False)
            for i in range(0, len(layer), 2)
        ]
    result = layer[0].result()

    def verify():
        _expect(result, n * (n + 1) // 2, "tree result")

    return Outcome(verify=verify if api.check else None, keep=layer)


def chain(api: Api, client, n: int) -> Outcome:
    """n tasks, each ``inc`` of the previous one's result."""
    fut = client.submit(inc, 0, pure=False)
    for _ in range(n - 1):
        fut = client.submit(inc, fut, pure=False)
    result = fut.result()

    def verify():
        _expect(result, n, "chain result")

    return Outcome(verify=verify if api.check else None, keep=fut)


@dataclass(frozen=True)
class Workload:
    name: str  # used by --only
    func: Callable[[Api, Any, int], Outcome]
    full: int  # size parameter of a full run
    quick: int  # size parameter of a --quick run
    kind: str  # "latency" | "throughput" | "hop"
    description: str

    def label(self, size: int) -> str:
        if self.name == "tree":
            return f"tree-{size}"
        if size >= 1000 and size % 1000 == 0 and self.kind == "throughput":
            return f"{self.name}-{size // 1000}K"
        return f"{self.name}-{size}"

    def n_tasks(self, size: int) -> int:
        if self.name == "tree":
            return 2 ** (size + 1) - 1
        if self.name == "merge":
            return size + 1
        return size


WORKLOADS = [
    Workload(
        "latency", latency, 300, 50, "latency",
        "sequential `client.submit(inc, i, pure=False).result()` round trips",
    ),
    Workload(
        "map", map_, 50_000, 5_000, "throughput",
        "`client.map(inc, range(n))` then `wait`",
    ),
    Workload(
        "merge", merge, 10_000, 1_000, "throughput",
        "n independent `inc` tasks plus one `sum_list` task taking all n futures as one list",
    ),
    Workload(
        "tree", tree, 14, 10, "throughput",
        "pairwise `add` reduction of 2**n `inc` leaves (2**(n+1) - 1 tasks)",
    ),
    Workload(
        "chain", chain, 2_000, 200, "hop",
        "n tasks, each `inc` of the previous future",
    ),
]

ZERO_WORKLOADS = ["map", "merge", "tree"]  # run again on zero workers (shoal only)

BY_NAME = {w.name: w for w in WORKLOADS}
