#!/usr/bin/env bash
# The whole test suite from a fresh clone: set up, lint, type-check, test. What .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
# pytest exits 5 when it collected nothing; set -e turns that (like any failure) into a failed run.
.venv/bin/python -m pytest -q "$@"
