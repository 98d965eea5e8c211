#!/usr/bin/env bash
# Quick start: set up, then run the main job end to end on the embedded defaults:
# the generator source → change buffer → Spark-built snapshots and diffs → manifest, in ./.snapshotter,
# with at least one re-base, a verification, and a rebuild compared with the source table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/snapshotter demo "$@"
