"""A worker's per-task decode and run of graph_scale's graph, in one process (issue 16).

Encodes ``(da.ones((n,), chunks=1) + 1).sum()`` as a client does (optimised, Blockwise
layers expanded, layer templates), then decodes and runs every task in dependency order
as a worker's task thread does, alternating run by run between

* ``unpickle``: each task's template unpickled with its slots in place (before), and
* ``plan``: each template decoded once, each task filling in its slots
  (``shoal/protocol/template_plan.py``),

both through the same fused-chain runner (``shoal/server/fused_chains.py``). Prints
the median µs per task of decoding and of running, and the load.

    PYTHONPATH=. python benchmarks/task_decode.py --chunks 20000 --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import Any


def encoded_graph(chunks: int) -> tuple[list[Any], dict[str, bytes], float]:
    """(task specs in dependency order, the function table, the expected result)."""
    import dask.array as da
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr

    from shoal.client.graph.blockwise_expand import materialize
    from shoal.client.graph.collections import _flatten
    from shoal.client.graph.dask_graph import GraphEncoder, cull
    from shoal.client.graph.order import dependency_first
    from shoal.protocol.serialize import FunctionTable

    expr = FinalizeCompute(collections_to_expr([(da.ones((chunks,), chunks=1) + 1).sum()], True))
    expr = expr.optimize()
    dsk, _ = materialize(expr)
    dsk = cull(dsk, list(_flatten(expr.__dask_keys__())))
    table = FunctionTable()
    encoder = GraphEncoder(table, {})
    encoder.start_graph()
    specs = [encoder.task_spec(k, dsk[k]) for k in dependency_first(dsk)]
    return specs, dict(table.bytes), 2.0 * chunks


def run_once(specs: list[Any], functions: dict[str, bytes], plan: bool) -> tuple[float, float, Any]:
    from shoal.protocol.serialize import FunctionCache, loads_task_args
    from shoal.protocol.template_plan import TemplatePlan
    from shoal.server.fused_chains import with_fast_chains

    cache = FunctionCache()
    cache.add(functions)
    loaded: dict[str, Any] = {}

    def get_func(fid: str) -> Any:  # as the worker's TaskThreadMixin._function
        obj = loaded.get(fid)
        if obj is None:
            obj = with_fast_chains(cache.get(fid))
            if plan and type(obj) is bytes:
                obj = TemplatePlan.compile(obj, get_func) or obj
            loaded[fid] = obj
        return obj

    data: dict[Any, Any] = {}
    decode = run = 0.0
    clock = time.perf_counter
    for spec in specs:
        t0 = clock()
        func = get_func(spec.func)
        args, kwargs = loads_task_args(spec.payload, data.__getitem__, get_func)
        t1 = clock()
        data[spec.key] = func(*args, **kwargs)
        run += clock() - t1
        decode += t1 - t0
    return decode, run, data[specs[-1].key]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=20_000, help="leaves of the graph")
    p.add_argument("--repeats", type=int, default=5, help="runs per mode")
    args = p.parse_args()
    specs, functions, expected = encoded_graph(args.chunks)
    print(f"{len(specs):,} tasks; load {os.getloadavg()[0]:.1f}")
    times: dict[str, list[tuple[float, float]]] = {"unpickle": [], "plan": []}
    for mode in times:  # warm both paths up
        run_once(specs, functions, mode == "plan")
    for r in range(args.repeats):
        for mode in list(times) if r % 2 == 0 else list(reversed(times)):
            gc.collect()
            decode, run, result = run_once(specs, functions, mode == "plan")
            if result != expected:
                raise AssertionError(f"{mode}: the result is {result!r}, expected {expected}")
            times[mode].append((decode, run))
    n = len(specs)
    for mode, runs in times.items():
        decode = statistics.median(d for d, _ in runs) / n * 1e6
        run = statistics.median(r for _, r in runs) / n * 1e6
        print(f"{mode:>8}: decode {decode:6.2f} µs/task, run {run:6.2f} µs/task")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
