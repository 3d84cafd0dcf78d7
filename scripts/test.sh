#!/usr/bin/env bash
# Install the system packages the tests use, shoal with its test dependencies (and Dask
# distributed, which the benchmark tests run side by side), check style and types, run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh  # SLURM, Grid Engine, network namespaces
python -m pip install --quiet --disable-pip-version-check -e ".[test,fast,bench]"
python -m ruff check shoal tests benchmarks
python -m mypy -p shoal
python -m pytest -q "$@"
