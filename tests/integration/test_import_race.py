"""Concurrent first-time imports while a fresh worker deserialises tasks.

Found running Dask's xarray notebook with ``threads_per_worker=2``: two task threads
of a fresh worker unpickled task functions and arguments at once, importing numpy,
dask.array and xarray concurrently; Python raised ``_DeadlockError`` (or "partially
initialized module"), numpy stayed half-imported in that process, and every later task
there failed (``module 'numpy._core' has no attribute '_multiarray_umath'``).

Here fresh worker processes with 8 threads each get, all at once, tasks whose
functions are pickled by value (defined in a module no worker can import) and whose
globals and arguments reference heavy modules none of them has imported yet. Every
task must succeed, and so must a later task using numpy and pandas on each worker.
On the code before the fix, about 4 in 10 such processes broke (measured outside
shoal too: 8 threads unpickling these objects at once in a fresh interpreter), so
with 6 of them the test failed nearly every run.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from shoal import Client, LocalCluster

pytest.importorskip("pandas")
pytest.importorskip("dask.dataframe")
pytest.importorskip("pyarrow")
pytest.importorskip("scipy.sparse")

import dask.array as da  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import scipy.sparse as sp  # noqa: E402

N_WORKERS = 6
N_THREADS = 8

# Functions that live in a module no worker can import: cloudpickle sends them by
# value, with references to the modules their globals name (imported on unpickling).
SOURCE = """
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp


def with_numpy(arg):
    x, _ = arg
    return float(np.asarray(x).sum())


def with_pandas(arg):
    df, _ = arg
    return float(pd.DataFrame(df).to_numpy().sum())


def with_dask_array(arg):
    n, _ = arg
    return float(da.ones(n, chunks=2).sum().compute(scheduler="sync"))


def with_dask_dataframe(arg):
    n, _ = arg
    frame = dd.from_pandas(pd.DataFrame({"a": range(n)}), npartitions=2)
    return float(frame.a.sum().compute(scheduler="sync"))


def with_pyarrow(arg):
    arr, _ = arg
    return float(pa.compute.sum(pa.array(arr)).as_py())


def with_scipy(arg):
    m, _ = arg
    return float(sp.csr_matrix(m).sum())


def afterwards(x):
    return float(np.ones(3).sum() + pd.Series([1.0, 2.0]).sum() + x)
"""
MODULE = "shoal_test_by_value_functions"
funcs: dict[str, Any] = {"__name__": MODULE}
exec(compile(SOURCE, f"<{MODULE}>", "exec"), funcs)
assert MODULE not in sys.modules


def heavy_objects() -> list[Any]:
    return [
        pd.DataFrame({"a": [1.0, 2.0]}),
        np.arange(4.0),
        sp.eye(3, format="csr"),
        pa.array([1, 2, 3]),
        pd.Series([5.0]),
        np.ones((2, 2)),
    ]


def tasks() -> list[tuple[Any, Any, float]]:
    """(function, argument, expected) for one worker, one per thread: each starts with
    a different heavy module, and its argument holds objects of every such module,
    in an order of its own (so the threads import them in different orders)."""
    names = [
        "with_pandas",
        "with_numpy",
        "with_scipy",
        "with_pyarrow",
        "with_dask_array",
        "with_dask_dataframe",
        "with_pandas",
        "with_numpy",
    ]
    args: list[Any] = [
        pd.DataFrame({"a": [1.0, 2.0]}),
        np.arange(4.0),
        sp.eye(3, format="csr"),
        pa.array([1, 2, 3]),
        4,
        4,
        pd.Series([5.0]),
        np.ones((2, 2)),
    ]
    expected = [3.0, 6.0, 3.0, 6.0, 4.0, 6.0, 5.0, 4.0]
    out = []
    for i, name in enumerate(names):
        objs = heavy_objects()
        extra = objs[i % len(objs) :] + objs[: i % len(objs)]
        out.append((funcs[name], (args[i], extra), expected[i]))
    return out


@pytest.mark.timeout(240)
def test_fresh_workers_with_many_threads_deserialise_heavy_imports_safely() -> None:
    assert da is not None  # the test process has them; the workers do not yet
    with (
        LocalCluster(
            n_workers=N_WORKERS, threads_per_worker=N_THREADS, nanny=False, timeout=120
        ) as cluster,
        Client(cluster, timeout=60) as client,
    ):
        names = [str(i) for i in range(N_WORKERS)]
        futures = []
        for name in names:
            for func, arg, expected in tasks():
                fut = client.submit(func, arg, workers=[name], pure=False)
                futures.append((name, fut, expected))
        problems = []
        for name, fut, expected in futures:
            exc = fut.exception(timeout=120)
            if exc is not None:
                problems.append(f"worker {name}: {type(exc).__name__}: {exc}")
            elif fut.result() != expected:
                problems.append(f"worker {name}: {fut.result()} != {expected}")
        # every later task on each of those processes works too (nothing half-imported)
        later = [client.submit(funcs["afterwards"], 1.0, workers=[n], pure=False) for n in names]
        for name, fut in zip(names, later, strict=True):
            exc = fut.exception(timeout=120)
            if exc is not None:
                problems.append(f"worker {name} afterwards: {type(exc).__name__}: {exc}")
        assert not problems, "\n".join(problems)
