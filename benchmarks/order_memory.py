"""Peak memory and cost of ``dask.order`` against shoal's cheap dependency-first order.

    python benchmarks/order_memory.py [--large 100k] [--skip-dask-tests] [--out FILE]

Two parts:

* dask's own ordering tests: every graph that ``dask/tests/test_order.py`` hands to
  ``dask.order.order`` (its tests are run with pytest, ``order`` recording each graph; a
  graph is kept once however often it is ordered). For each: the peak memory (the largest
  number of results held when the tasks run one at a time in that order, as
  ``dask.order.diagnostics`` computes it) under ``dask.order``, under
  :func:`shoal.client.graph.order.dependency_first`, and under shoal's choice
  (``submission_order`` with the default ``shoal.client.order.max-tasks``).
* large array graphs (``--large`` tasks or so each; the first is graph_scale's
  ``(da.ones((c,), chunks=1) + k).sum()``): both orders' peak memory and µs per task.

The report (markdown) goes to stdout, or to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def peak_memory(dsk: Mapping[Any, Any], keys_in_order: list[Any]) -> int:
    """The most results alive at once, running ``keys_in_order`` one by one (Dask's
    ``diagnostics`` pressure)."""
    from dask.order import diagnostics

    rank = {k: i for i, k in enumerate(keys_in_order)}
    _, pressure = diagnostics(dict(dsk), rank)
    return max(pressure, default=0)


def dask_order(dsk: Mapping[Any, Any]) -> list[Any]:
    from dask.order import order

    priorities = order(dict(dsk))
    return sorted(dsk, key=priorities.__getitem__)


def as_nodes(dsk: Mapping[Any, Any]) -> dict[Any, Any]:
    from dask._task_spec import convert_legacy_graph

    return convert_legacy_graph(dict(dsk))


def cheap_order(dsk: Mapping[Any, Any]) -> list[Any]:
    from shoal.client.graph.order import dependency_first

    return dependency_first(as_nodes(dsk))


def shoal_order(dsk: Mapping[Any, Any]) -> list[Any]:
    from shoal.client.graph.order import DEFAULT_MAX_TASKS, submission_order

    return submission_order(as_nodes(dsk), DEFAULT_MAX_TASKS)


# ------------------------------------------------------------------ dask's own test graphs


def dask_test_graphs() -> list[tuple[str, dict[Any, Any]]]:
    """``(test id, graph)`` for every distinct graph dask's test_order.py orders."""
    import dask.order
    import pytest

    seen: set[Any] = set()
    graphs: list[tuple[str, dict[Any, Any]]] = []
    current = [""]
    real_order = dask.order.order

    def recording_order(dsk: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            graph = dict(dsk)
            fingerprint = tuple(sorted(map(repr, graph.items())))
            if graph and fingerprint not in seen:
                seen.add(fingerprint)
                graphs.append((current[0], graph))
        except Exception:  # a graph that cannot be copied: not ours to judge
            pass
        return real_order(dsk, *args, **kwargs)

    class Recorder:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item: Any) -> Any:
            current[0] = item.name
            module = item.module
            saved = module.order
            module.order = recording_order
            dask.order.order = recording_order
            try:
                yield
            finally:
                module.order = saved
                dask.order.order = real_order

    code = pytest.main(
        ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--pyargs", "dask.tests.test_order"],
        plugins=[Recorder()],
    )
    if code not in (0, 1):
        raise RuntimeError(f"dask's test_order.py did not run (pytest exit code {code})")
    return graphs


def compare(dsk: Mapping[Any, Any]) -> dict[str, Any]:
    """Peak memory of the three orders (None where the graph cannot be simulated)."""
    out: dict[str, Any] = {"tasks": len(dsk)}
    for name, fn in (("dask", dask_order), ("cheap", cheap_order), ("shoal", shoal_order)):
        try:
            out[name] = peak_memory(dsk, fn(dsk))
        except Exception as e:  # e.g. dependencies outside the graph, a cycle
            out[name] = None
            out["note"] = type(e).__name__
    return out


# ------------------------------------------------------------------ large array graphs


def large_graphs(size: int) -> list[tuple[str, Callable[[], Any]]]:
    import dask.array as da

    c = max(4, 3 * size // 4)
    side = max(2, int((size / 3) ** 0.5))
    return [
        (
            "(ones((c,), chunks=1) + k).sum()  [graph_scale]",
            lambda: (da.ones((c,), chunks=1) + 1).sum(),
        ),
        ("ones((n, n), chunks=1).sum(axis=0)", lambda: da.ones((side, side), chunks=1).sum(axis=0)),
        ("x - x.mean(axis=0), x = random((n, n), chunks=1)", lambda: _anom(side)),
        ("(x @ x.T).sum(), x = ones((m, m), chunks=1)", lambda: _matmul(size)),
    ]


def _anom(side: int) -> Any:
    import dask.array as da

    x = da.random.random((side, side), chunks=1)
    return (x - x.mean(axis=0)).sum()


def _matmul(size: int) -> Any:
    import dask.array as da

    m = max(2, int(round(size ** (1 / 3))))
    x = da.ones((m, m), chunks=1)
    return (x @ x.T).sum()


def large_row(name: str, build: Callable[[], Any]) -> dict[str, Any]:
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr
    from dask.order import order

    from shoal.client.graph.dask_graph import materialize
    from shoal.client.graph.order import dependency_first

    expr = FinalizeCompute(collections_to_expr([build()], True)).optimize()
    dsk, _ = materialize(expr)
    t0 = time.perf_counter()
    priorities = order(dsk)
    t_dask = time.perf_counter() - t0
    t0 = time.perf_counter()
    cheap = dependency_first(dsk)
    t_cheap = time.perf_counter() - t0
    n = len(dsk)
    return {
        "graph": name,
        "tasks": n,
        "dask peak": peak_memory(dsk, sorted(dsk, key=priorities.__getitem__)),
        "cheap peak": peak_memory(dsk, cheap),
        "dask µs/task": 1e6 * t_dask / n,
        "cheap µs/task": 1e6 * t_cheap / n,
    }


# ------------------------------------------------------------------ report


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.1f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def report(large: int, with_dask_tests: bool) -> str:
    import os

    parts = [
        "# Peak memory: dask.order vs shoal's dependency-first order",
        "",
        f"load average before: {os.getloadavg()[0]:.2f}; peak = most results alive at once "
        "(dask.order.diagnostics).",
    ]
    if with_dask_tests:
        rows = []
        for test, dsk in dask_test_graphs():
            rows.append({"test": test, **compare(dsk)})
        worse = [r for r in rows if None not in (r["dask"], r["cheap"]) and r["cheap"] > r["dask"]]
        differs = [
            r for r in rows if None not in (r["dask"], r["shoal"]) and r["shoal"] > r["dask"]
        ]
        parts += [
            "",
            "## dask/tests/test_order.py graphs",
            "",
            f"{len(rows)} distinct graphs; the cheap order holds more than dask.order on "
            f"{len(worse)}; shoal's choice holds more than dask.order on {len(differs)}.",
            "",
            table(rows, ["test", "tasks", "dask", "cheap", "shoal", "note"]),
        ]
    rows = [large_row(name, build) for name, build in large_graphs(large)]
    parts += [
        "",
        f"## Large array graphs (~{large:,} tasks)",
        "",
        table(rows, ["graph", "tasks", "dask peak", "cheap peak", "dask µs/task", "cheap µs/task"]),
        "",
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", default="100k", help="task count of the large graphs")
    parser.add_argument("--skip-dask-tests", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from benchmarks.graph_scale import parse_count

    text = report(parse_count(args.large), not args.skip_dask_tests)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
