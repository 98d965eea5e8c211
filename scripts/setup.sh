#!/usr/bin/env bash
# Create .venv (if missing) and install the project with its dev extras. Idempotent; safe to re-run.
# Needs Python 3.11+ and pip; Java 17 for Spark (checked, not installed: it comes with the machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# Byte-compile the project's own modules (up-to-date files are skipped): a process that may not
# write them (the image's non-root user, PYTHONDONTWRITEBYTECODE) would otherwise compile every
# one of its imports from source at each start, run workers and Spark's Python workers included.
.venv/bin/python -m compileall -q snapshot_assets resources sensors >/dev/null
if ! command -v java >/dev/null 2>&1; then
  echo "warning: java not found; Spark needs Java 17" >&2
fi
