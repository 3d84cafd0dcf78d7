#!/usr/bin/env bash
# Install shoal with its test dependencies, check style and types, run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -e ".[test,fast]"
python -m ruff check shoal tests benchmarks
python -m mypy -p shoal
python -m pytest -q "$@"
