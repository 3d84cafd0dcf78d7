"""Run every notebook with Dask distributed (and, with ``--compare``, with shoal too),
write what its cells showed to ``expected/<notebook>.json``, and print a table::

    PYTHONPATH=. python tests/notebooks/record_expected.py [--compare] [NOTEBOOK ...]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from outputs import differences, digests
from test_notebooks import HERE, NOTEBOOKS, run_notebook


def main(argv: list[str]) -> None:
    compare = "--compare" in argv
    names = [a for a in argv if not a.startswith("--")] or list(NOTEBOOKS)
    (HERE / "expected").mkdir(exist_ok=True)
    print(f"{'notebook':26} {'shoal ok':9} {'equal':6} {'shoal s':>8} {'dask s':>8}")
    for name in names:
        spec = NOTEBOOKS[name]
        with tempfile.TemporaryDirectory() as d:
            dask = run_notebook(name, "dask", Path(d))
        want = digests(dask["outputs"], spec.loose)
        with open(HERE / "expected" / f"{name}.json", "w") as f:
            json.dump({"outputs": want}, f, indent=1, sort_keys=True)
            f.write("\n")
        if not compare:
            print(f"{name:26} {'-':9} {'-':6} {'-':>8} {dask['seconds']:8.1f}")
            continue
        with tempfile.TemporaryDirectory() as d:
            try:
                shoal = run_notebook(name, "shoal", Path(d))
            except AssertionError as e:
                print(f"{name:26} {'FAILED':9} {'-':6} {'-':>8} {dask['seconds']:8.1f}\n{e}")
                continue
        got = digests(shoal["outputs"], spec.loose)
        diff = [] if got.keys() != want.keys() else differences(want, got)
        equal = got.keys() == want.keys() and not diff
        print(
            f"{name:26} {'yes':9} {'yes' if equal else 'NO':6} "
            f"{shoal['seconds']:8.1f} {dask['seconds']:8.1f}"
        )
        for line in diff[:10]:
            print("   ", line)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(sys.argv[1:])
