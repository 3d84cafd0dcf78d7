"""Run one Dask example notebook (a script of its code cells, ``# %%`` between cells)
the way Jupyter would, with Dask distributed or with shoal, and save what its cells
showed.

    python run_notebook.py SCRIPT {dask,shoal} OUT.pkl

With ``shoal``, the only change made to the script is its import lines:
``from dask.distributed import ...`` becomes ``from shoal import ...``. As IPython
does, ``%time``/``%%time``/``%matplotlib`` lines are dropped and ``!cmd`` lines run in a
shell. A cell headed ``# %% skip: why`` is not run (a tool the test machine lacks); one
headed ``# %% expect-error: Name why`` must raise that exception (a cell that fails on
Dask distributed itself with today's dask), which is its output.
``random``, NumPy's and dask.array's generators are seeded first, so both runs build
the same data. The value of each cell's last expression (its Out[]) is kept when it is
data (numbers, strings, arrays, pandas and xarray objects in memory, containers of
them, fitted estimators as their coefficients); futures, clients and lazy collections
are not data and are left out; what a cell prints is kept too (``"<cell>:stdout"``).
The output file holds ``{"outputs": {cell: value}, "seconds": wall time}``.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import pickle
import random
import re
import sys
import time
from typing import Any

IMPORT = re.compile(r"^(\s*)from dask\.distributed import ", re.MULTILINE)
NOT_DATA = object()


class Tee(io.TextIOBase):
    """What a cell prints: kept, and shown as it runs."""

    def __init__(self, *streams: Any):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)


def cells_of(source: str) -> list[tuple[str, str]]:
    """(header, code) of each cell."""
    cells: list[tuple[str, str]] = []
    header, lines = "", []  # code before the first marker is a cell too
    for line in source.splitlines():
        if line.startswith("# %%"):
            if any(s.strip() for s in lines):
                cells.append((header, "\n".join(lines)))
            header, lines = line, []
        else:
            lines.append(line)
    if any(s.strip() for s in lines):
        cells.append((header, "\n".join(lines)))
    return cells


def ipython_lines(code: str) -> str:
    out = []
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith(("%%time", "%matplotlib")):
            continue
        if stripped.startswith("%time "):
            line = line.replace("%time ", "", 1)
        elif stripped.startswith("!"):
            indent = line[: len(line) - len(line.lstrip())]
            line = f"{indent}__import__('subprocess').run({stripped[1:]!r}, shell=True)"
        out.append(line)
    return "\n".join(out)


def as_data(value: Any) -> Any:
    """``value`` as comparable data, or NOT_DATA."""
    import numpy as np
    import pandas as pd

    if isinstance(value, str):  # paths in the run's directory, as the notebook names them
        return value.replace(os.getcwd() + os.sep, "")
    if value is None or isinstance(value, bool | int | float | np.generic):
        return value
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, pd.Series) and value.dtype == object:
        items = [as_data(v) for v in value.tolist()]
        if any(v is NOT_DATA for v in items):
            return NOT_DATA
        return ("series", list(value.index), items, value.name)
    if isinstance(value, pd.DataFrame | pd.Series | pd.Index):
        return value
    if type(value).__module__.startswith("xarray"):
        data = getattr(value, "data", None)
        if isinstance(data, np.ndarray):
            return ("xarray", value.name, value.dims, data)
        return NOT_DATA
    if type(value).__module__.startswith("sklearn"):  # a fitted estimator
        return ("estimator", type(value).__name__, value.coef_, value.intercept_)
    if isinstance(value, list | tuple):
        items = [as_data(v) for v in value]
        return NOT_DATA if any(v is NOT_DATA for v in items) else type(value)(items)
    if isinstance(value, dict):
        items = {k: as_data(v) for k, v in value.items()}
        return NOT_DATA if any(v is NOT_DATA for v in items.values()) else items
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return NOT_DATA


def run(script: str, flavour: str) -> dict[str, Any]:
    with open(script) as f:
        source = f.read()
    if flavour == "shoal":
        source, n = IMPORT.subn(r"\1from shoal import ", source)
        if not n:
            raise SystemExit(f"{script} has no 'from dask.distributed import' line")
    elif flavour != "dask":
        raise SystemExit(f"run with 'dask' or 'shoal', not {flavour!r}")
    import dask.array as da
    import numpy as np

    random.seed(0)
    np.random.seed(0)
    da.random.seed(0)
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": script}
    outputs: dict[int | str, Any] = {}
    cell_seconds: dict[int, float] = {}
    start = time.perf_counter()
    for i, (header, code) in enumerate(cells_of(source)):
        if header.startswith("# %% skip"):
            continue
        tree = ast.parse(ipython_lines(code), script)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        cell_start = time.perf_counter()
        printed = io.StringIO()
        expected_error = header.partition("# %% expect-error:")[2].split()
        with contextlib.redirect_stdout(Tee(printed, sys.stdout)):
            try:
                exec(compile(tree, script, "exec"), namespace)
                value = None
                if last is not None:
                    value = eval(compile(ast.Expression(last.value), script, "eval"), namespace)
            except Exception as e:
                if type(e).__name__ not in expected_error:
                    raise
                value = f"error: {type(e).__name__}"
            else:
                if expected_error:
                    raise SystemExit(f"cell {i} was expected to raise {expected_error[0]}")
        data = as_data(value)
        if data is not NOT_DATA and data is not None:
            outputs[i] = data
        if printed.getvalue():
            outputs[f"{i}:stdout"] = printed.getvalue()
        cell_seconds[i] = time.perf_counter() - cell_start
    from dask.base import get_scheduler

    scheduler = get_scheduler()  # what .compute() ran on: the notebook's client
    return {
        "scheduler": getattr(scheduler, "__module__", None) or repr(scheduler),
        "outputs": outputs,
        "seconds": time.perf_counter() - start,
        "cell_seconds": cell_seconds,
    }


def main() -> None:
    script, flavour, out = sys.argv[1:4]
    result = run(script, flavour)
    with open(out, "wb") as f:
        pickle.dump(result, f)
    sys.stdout.flush()  # then exit as a notebook kernel would: the library's handlers run


if __name__ == "__main__":
    main()
