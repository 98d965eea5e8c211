#!/usr/bin/env bash
# Quick start: set up, then run the main job end to end on the embedded defaults.
# Today the main job is the read side: verify the shipped sample archive and rebuild the table from
# it, at its head and at an earlier position, in both laredo formats.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
archive=examples/sample-archive
run() { echo "\$ snapshotter $*"; .venv/bin/snapshotter "$@"; echo; }
run inspect --store local --path "$archive" --key-prefix users/
run verify --store local --path "$archive" --key-prefix users/
run reconstruct --store local --path "$archive" --key-prefix users/ --format jsonl --output jsonl
run reconstruct --store local --path "$archive" --key-prefix users/ --format protobuf --at 0/016B3900
