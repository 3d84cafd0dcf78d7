"""Task functions and workloads.

The task functions (``inc``, ``add``, ``sum_list``, and ``submit_incs`` for
``benchmarks/worker_clients.py``) live in this importable module
(``benchmarks.workloads``) so that both shoal and Dask pickle them *by reference*;
the worker processes get the repository root on ``PYTHONPATH`` to import them.

Each workload is written once against the common client API
(``client.submit``, ``client.map``, ``future.result``, ``client.gather`` and the
module-level ``wait``) and runs unchanged against shoal and Dask.  A workload
returns an :class:`Outcome`; everything inside the workload call is timed, while
``Outcome.verify`` runs after the clocks stop.
"""

from __future__ import annotations

import functools
import importlib
import pathlib
import subprocess
import sys
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


def submit_incs(module: str, start: int, n: int) -> int:
    """A task that submits tasks (the ``worker_clients`` benchmark): with the
    ``worker_client`` of ``module`` (``"shoal"`` or ``"distributed"``), submit
    ``inc(start)`` ... ``inc(start + n - 1)``, gather them and return their sum."""
    worker_client = importlib.import_module(module).worker_client
    with worker_client() as client:
        futs = [client.submit(inc, start + j, pure=False) for j in range(n)]
        return sum(client.gather(futs))


def dask_executed_count(dask_worker) -> int:
    """Tasks a Dask worker has executed (run on the worker by ``Client.run``)."""
    return dask_worker.state.executed_count


# --- workloads ------------------------------------------------------------------------


@dataclass
class Api:
    """What a workload needs from one system besides the client itself."""

    wait: Callable[..., Any]
    map_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"pure": False}
    check: bool = True  # verify results (False for zero workers: results are None)
    scheduler_pid: int | None = None  # for workloads that read the scheduler's memory


@dataclass
class Outcome:
    samples: list[float] | None = None  # per-call seconds (latency workload)
    verify: Callable[[], None] | None = None  # run after timing; raises on a wrong result
    keep: Any = None  # futures to keep alive until verification is done
    metrics: dict[str, float] = field(default_factory=dict)  # workload-specific figures


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


# --- a by-value function: partial vs plain ----------------------------------------

MAIN_TASK = "path_task"  # defined in benchmarks/run.py, i.e. in the script's __main__


def main_function() -> Callable[[pathlib.Path], Any]:
    """The ``partial_path`` task function, taken from the ``__main__`` module.

    It has to live in ``__main__`` so that both systems pickle it *by value*
    (cloudpickle); that is the case distributed#8767 is about.
    """
    fn = getattr(sys.modules.get("__main__"), MAIN_TASK, None)
    if fn is None or getattr(fn, "__module__", None) != "__main__":
        raise RuntimeError(
            f"the partial_path workloads need {MAIN_TASK}() defined in the __main__ module: "
            "run them through benchmarks/run.py"
        )
    return fn


def _paths(n: int) -> list[pathlib.Path]:
    return [pathlib.Path(f"/data/{i}") for i in range(n)]


def prepare_partials(n: int) -> list[functools.partial]:
    f = main_function()
    return [functools.partial(f, p) for p in _paths(n)]


def prepare_paths(n: int) -> tuple[Callable[[pathlib.Path], Any], list[pathlib.Path]]:
    return main_function(), _paths(n)


def partial_path(api: Api, client, partials: list[functools.partial]) -> Outcome:
    """One ``client.submit(functools.partial(f, Path(...)), pure=False)`` per task."""
    futs = [client.submit(p, pure=False) for p in partials]
    api.wait(futs)
    return _path_outcome(api, client, futs)


def plain_path(api: Api, client, prepared) -> Outcome:
    """The same tasks without a partial: ``client.submit(f, Path(...), pure=False)``."""
    f, paths = prepared
    futs = [client.submit(f, p, pure=False) for p in paths]
    api.wait(futs)
    return _path_outcome(api, client, futs)


def _path_outcome(api: Api, client, futs: list) -> Outcome:
    n = len(futs)

    def verify():  # the workers really did unpickle and run the __main__ function
        _expect(client.gather([futs[0], futs[-1]]), ["0", str(n - 1)], "path task results")

    return Outcome(verify=verify if api.check else None, keep=futs)


# --- dask collections ------------------------------------------------------------------


def dask_task_count(collection: Any) -> int:
    """Tasks in ``collection``'s graph as ``distributed.Client.compute`` submits it
    (after dask's optimisation and fusion)."""
    try:
        from dask._expr import FinalizeCompute
        from dask.base import collections_to_expr
    except ImportError:  # pragma: no cover - an older dask
        import dask

        (opt,) = dask.optimize(collection)
        return len(opt.__dask_graph__())
    expr = FinalizeCompute(collections_to_expr([collection], True)).optimize()
    return len(expr.__dask_graph__())


ARRAY_CHUNK = 100


def prepare_array(side: int) -> Any:
    """``(x + x.T).mean()`` of a ``side`` × ``side`` uniform random array in 100 × 100
    chunks (a new random seed, so new keys, every time)."""
    import dask.array as da

    x = da.random.random((side, side), chunks=(ARRAY_CHUNK, ARRAY_CHUNK))
    return (x + x.T).mean()


def array(api: Api, client, expr: Any) -> Outcome:
    """``client.compute(expr).result()`` for a dask array expression."""
    result = client.compute(expr).result()

    def verify():  # the mean of u + u' for uniform u is 1
        if not abs(float(result) - 1.0) < 0.01:
            raise AssertionError(f"array result: expected about 1.0, got {result!r}")

    return Outcome(verify=verify if api.check else None)


def million_chunks(n_tasks: int) -> int:
    """Chunks of ``da.ones((c,), chunks=1).sum()`` for about ``n_tasks`` tasks: one fused
    ones+sum task per chunk plus a 4-way reduction tree (c/4 + c/16 + ... ≈ c/3)."""
    return max(1, n_tasks * 3 // 4)


def prepare_million(n_tasks: int) -> tuple[Any, int]:
    """(the collection, its number of chunks = its expected sum)."""
    import dask.array as da

    chunks = million_chunks(n_tasks)
    return da.ones((chunks,), chunks=1).sum(), chunks


def _status_kb(pid: int, field_name: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field_name} in /proc/{pid}/status")


def _reset_peak_rss(pid: int) -> bool:
    """Reset the kernel's VmHWM of ``pid`` to its current RSS (Linux clear_refs '5')."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


# The sampler's own process: it prints the highest VmRSS of a pid it saw, every
# ``interval`` seconds, until its stdin closes.
_SAMPLER = """
import select, sys
pid, interval, peak = int(sys.argv[1]), float(sys.argv[2]), 0
while True:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    peak = max(peak, int(line.split()[1]))
    except OSError:
        pass
    if select.select([sys.stdin], [], [], interval)[0]:
        break
print(peak, flush=True)
"""


class _RssSampler:
    """Samples VmRSS every ``interval`` seconds (a cross-check of VmHWM), from a
    process of its own: a sampling thread in this process (the client's) would take the
    GIL from the client 50 times a second, and that slowed a 1M-task submission by a
    fifth (29 s against 23 s measured)."""

    def __init__(self, pid: int, interval: float = 0.02):
        self.pid, self.interval, self.peak = pid, interval, 0
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> _RssSampler:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SAMPLER, str(self.pid), str(self.interval)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._proc is not None
        try:
            out, _ = self._proc.communicate("", timeout=30)
            self.peak = max(self.peak, int(out.strip() or 0))
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()


def million(api: Api, client, prepared: tuple[Any, int]) -> Outcome:
    """``client.compute`` of a big graph: submission time, time to the result, and the
    scheduler's peak RSS above its idle RSS (to be divided by the number of tasks)."""
    collection, chunks = prepared
    pid = api.scheduler_pid
    if pid is None:
        raise RuntimeError("million needs the scheduler's pid")
    reset = _reset_peak_rss(pid)
    idle_kb = _status_kb(pid, "VmRSS")
    with _RssSampler(pid) as sampler:
        t0 = time.perf_counter()
        fut = client.compute(collection)
        t1 = time.perf_counter()
        api.wait(fut)
        t2 = time.perf_counter()
    peak_kb = max(_status_kb(pid, "VmHWM"), sampler.peak)

    def verify():
        _expect(int(fut.result()), chunks, "million result")

    metrics = {
        "submit s": t1 - t0,
        "result s": t2 - t0,
        "sched peak RSS bytes": (peak_kb - idle_kb) * 1024.0,
        "sched idle RSS bytes": idle_kb * 1024.0,
        "peak reset": float(reset),
    }
    return Outcome(verify=verify if api.check else None, keep=fut, metrics=metrics)


# --- the registry ----------------------------------------------------------------------

_COUNTS: dict[tuple[str, int], tuple[int, float]] = {}  # (name, size) -> (tasks, seconds)


@dataclass(frozen=True)
class Workload:
    """A workload and its sizes.

    ``func(api, client, x)`` is the timed part, where ``x`` is ``prepare(size)`` (run
    untimed before every run) if there is a ``prepare``, else ``size``.
    """

    name: str  # used by --only
    func: Callable[[Api, Any, Any], Outcome]
    full: int  # size parameter of a full run
    quick: int  # size parameter of a --quick run
    kind: str  # "latency" | "throughput" | "hop" | "wall" | "memory"
    description: str
    prepare: Callable[[int], Any] | None = None
    # Tasks of a size, measured from the graph (dask collections); cached per size.
    count: Callable[[int], int] | None = None
    systems: tuple[str, ...] | None = None  # None: every system
    zero: bool = False  # run on `--zero` workers on the systems that have them
    fresh_cluster: bool = False  # every run (warm-up too) on a newly started cluster
    warmup: bool = True  # one untimed run first
    timeout: float = 600.0  # seconds for a warm-up run (or any run without one)
    # Per-system (full, quick) sizes overriding full/quick.
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False)

    def size_for(self, system: str, quick: bool) -> int:
        full, small = self.sizes.get(system, (self.full, self.quick))
        return small if quick else full

    def label(self, size: int) -> str:
        if self.name == "tree":
            return f"tree-{size}"
        if self.kind in ("throughput", "memory") and size >= 1000:
            if size % 1_000_000 == 0:
                return f"{self.name}-{size // 1_000_000}M"
            if size % 1000 == 0:
                return f"{self.name}-{size // 1000}K"
        return f"{self.name}-{size}"

    def n_tasks(self, size: int) -> int:
        if self.count is not None:
            return self.counted(size)[0]
        if self.name == "tree":
            return 2 ** (size + 1) - 1
        if self.name == "merge":
            return size + 1
        return size

    def counted(self, size: int) -> tuple[int, float]:
        """(tasks, seconds the count took) for a size, measured once."""
        assert self.count is not None
        hit = _COUNTS.get((self.name, size))
        if hit is None:
            t0 = time.perf_counter()
            n = self.count(size)
            hit = _COUNTS[(self.name, size)] = (n, time.perf_counter() - t0)
        return hit


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
    Workload(
        "partial_path", partial_path, 20_000, 2_000, "throughput",
        "n `client.submit(functools.partial(f, Path(f'/data/{i}')), pure=False)`, then "
        "`wait`; `f` is defined in the script's `__main__`, so it is pickled by value",
        prepare=prepare_partials,
    ),
    Workload(
        "plain_path", plain_path, 20_000, 2_000, "throughput",
        "the `partial_path` tasks without a partial: n `client.submit(f, Path(...), "
        "pure=False)`, then `wait` (the control for shoal's partial cost)",
        prepare=prepare_paths,
        systems=("shoal",),
    ),
    Workload(
        "array", array, 5_000, 2_000, "wall",
        "`client.compute((x + x.T).mean()).result()`, `x = da.random.random((n, n), "
        "chunks=(100, 100))`",
        prepare=prepare_array,
        count=lambda side: dask_task_count(prepare_array(side)),
    ),
    Workload(
        "million", million, 1_000_000, 100_000, "memory",
        "`client.compute(da.ones((c,), chunks=1).sum())` with c = 3/4 of the size (about "
        "size tasks), then `wait`; shoal on `--zero` workers, Dask (no zero mode) on its "
        "normal workers at a smaller size; every run on a fresh cluster, no warm-up. "
        "Dask's `compute` sends the unmaterialised expression and its scheduler builds "
        "the graph, so its submit time leaves out graph construction; shoal's includes it",
        prepare=prepare_million,
        count=lambda n: dask_task_count(prepare_million(n)[0]),
        zero=True,
        # A peak RSS needs a scheduler that has not run the graph before, so a warm-up
        # run could only warm the client process, and prepare() already did.
        fresh_cluster=True,
        warmup=False,
        timeout=1800.0,  # Dask at 100,000 tasks takes minutes
        sizes={"dask": (100_000, 10_000)},
    ),
]

ZERO_WORKLOADS = ["map", "merge", "tree"]  # run again on zero workers (shoal only)

BY_NAME = {w.name: w for w in WORKLOADS}
