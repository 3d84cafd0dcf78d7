"""Run the shoal vs Dask benchmark suite: ``python benchmarks/run.py [--quick] ...``.

See benchmarks/README.md and ``--help``.
"""

import sys
from pathlib import Path


def path_task(path):
    """The task of the ``partial_path`` workloads.

    Defined here, in the script run as ``__main__``, on purpose: neither system can
    import it on a worker, so both must pickle it by value (cloudpickle), as with a
    function defined in a user's script or notebook (distributed#8767).
    """
    return path.name


def _main() -> int:
    # Make ``benchmarks`` importable as a package (the workers import the task
    # functions from ``benchmarks.workloads``; they get the same root on PYTHONPATH).
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.runner import main

    return main()


if __name__ == "__main__":
    sys.exit(_main())
