#!/usr/bin/env bash
# Install the system packages the tests use, shoal with its test dependencies (and Dask
# distributed, which the benchmark tests run side by side), check style and types, run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh  # SLURM, Grid Engine, network namespaces
python -m pip install --quiet --disable-pip-version-check -e ".[test,fast,bench]"
python -m ruff check shoal tests benchmarks
python -m mypy -p shoal
# Two test processes: most tests wait on their clusters' processes, so two at a time
# roughly halve the wall time on two cores (tests/conftest.py groups the ones that share
# a machine-wide resource).
python -m pytest -q -n 2 --dist loadgroup --durations=30 "$@"
