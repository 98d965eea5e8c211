#!/usr/bin/env bash
# The whole test suite from a fresh clone: set up, lint, type-check, test. What .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
# Two worker processes (TEST_WORKERS; 0 runs in this process), each taking a whole test file at a
# time, so a file's module fixtures (a PostgreSQL cluster, a Spark server) start once. Files go out
# in xdist's order (most tests first), which leaves the one-test end-to-end scenarios for the end:
# beside each other they are slow, but the slow multi-process files of tests/aws and tests/cli
# beside a daemon scenario made it slower still (15 minutes, past its own bounds).
# pytest exits 5 when it collected nothing; set -e turns that (like any failure) into a failed run.
.venv/bin/python -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
