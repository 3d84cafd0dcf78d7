"""What a notebook's cells showed, as JSON-able digests that two runs can be compared by
(``expected/<notebook>.json`` holds Dask distributed's), and the comparison.

A digest keeps values exactly where they are small (numbers, strings, short lists) and
summarises large ones by shape, dtype, sums and a few values. ``loose`` digests keep
only the structure (types, lengths, keys, shapes, columns): for notebooks whose data is
random on every run whatever the scheduler (mimesis records, ``random`` in threads)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

SMALL = 50  # containers up to this long are kept whole
REL_TOL = 1e-9


def digest(value: Any, loose: bool = False) -> Any:
    if isinstance(value, np.bool_):
        value = bool(value)
    if isinstance(value, bool | str) or value is None:
        return type(value).__name__ if loose and isinstance(value, str) else value
    if isinstance(value, int | np.integer):
        return "int" if loose else int(value)
    if isinstance(value, float | np.floating):
        return "float" if loose else float(value)
    if isinstance(value, np.ndarray):
        return _array(value, loose)
    if isinstance(value, pd.DataFrame | pd.Series | pd.Index):
        return _pandas(value, loose)
    if isinstance(value, tuple) and value and value[0] in ("xarray", "estimator", "series"):
        kind, *rest = value
        return {"kind": kind, "parts": [digest(v, loose) for v in rest]}
    if isinstance(value, list | tuple):
        kind = type(value).__name__
        if loose:  # how many is random too: the distinct shapes of the items
            shapes = {json.dumps(digest(v, loose), sort_keys=True) for v in value}
            return {"kind": kind, "of": sorted(shapes)}
        if len(value) <= SMALL:
            return {"kind": kind, "items": [digest(v, loose) for v in value]}
        return {"kind": kind, "len": len(value), "head": [digest(v, loose) for v in value[:5]]}
    if isinstance(value, dict):
        return {"kind": "dict", "items": {str(k): digest(v, loose) for k, v in value.items()}}
    raise TypeError(f"no digest for {type(value).__name__}")


def _array(a: np.ndarray, loose: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "ndarray", "shape": list(a.shape), "dtype": str(a.dtype)}
    if loose or a.dtype.kind not in "biuf":
        return out
    flat = a.astype("float64").ravel()
    out["sum"] = float(np.nansum(flat))
    out["sumsq"] = float(np.nansum(flat * flat))
    out["sample"] = [float(v) for v in flat[:: max(1, flat.size // 7)][:8]]
    return out


def _pandas(obj: Any, loose: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": type(obj).__name__, "shape": list(obj.shape)}
    if isinstance(obj, pd.DataFrame):
        out["columns"] = [str(c) for c in obj.columns]
        out["dtypes"] = [str(t) for t in obj.dtypes]
    else:
        out["dtype"] = str(obj.dtype)
    if loose:
        return out
    frame = obj.to_frame() if isinstance(obj, pd.Series | pd.Index) else obj
    if not isinstance(obj, pd.Index) and not obj.index.is_unique:
        # Rows of one label come in no set order after a shuffle (set_index), on Dask
        # distributed as on shoal: compared in a canonical order.
        frame = frame.reset_index().sort_values(by=list(frame.reset_index().columns))
        frame = frame.set_index(frame.columns[0])
    index = obj if isinstance(obj, pd.Index) else frame.index
    out["index"] = [str(i) for i in index[:5]] + [str(i) for i in index[-3:]]
    numeric = frame.select_dtypes("number")
    out["sums"] = [float(s) for s in numeric.sum()]
    out["head"] = [[_cell(v) for v in row] for row in frame.head(5).itertuples(index=False)]
    return out


def _cell(v: Any) -> Any:
    if isinstance(v, int | np.integer):
        return int(v)
    if isinstance(v, float | np.floating):
        return float(v)
    return str(v)


def differences(expected: Any, got: Any, where: str = "") -> list[str]:
    """Where ``got`` differs from ``expected`` (floats within a relative 1e-9)."""
    if isinstance(expected, float) and isinstance(got, float | int):
        same = math.isclose(expected, got, rel_tol=REL_TOL, abs_tol=1e-12) or (
            math.isnan(expected) and math.isnan(got)
        )
        return [] if same else [f"{where}: {got!r} != {expected!r}"]
    if isinstance(expected, dict) and isinstance(got, dict):
        if expected.keys() != got.keys():
            return [f"{where}: keys {sorted(got)} != {sorted(expected)}"]
        return [d for k in expected for d in differences(expected[k], got[k], f"{where}.{k}")]
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{where}: length {len(got)} != {len(expected)}"]
        return [
            d
            for i, (e, g) in enumerate(zip(expected, got))
            for d in differences(e, g, f"{where}[{i}]")
        ]
    return [] if expected == got else [f"{where}: {got!r} != {expected!r}"]


def digests(outputs: dict[Any, Any], loose: bool) -> dict[str, Any]:
    """``{cell: digest}`` of a run's outputs (keys as strings, for JSON)."""
    return {str(cell): digest(value, loose) for cell, value in outputs.items()}
