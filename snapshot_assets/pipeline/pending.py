"""The hand-off between the artifact step and the manifest step of one run.

The snapshot/diff asset uploads an artifact and records it here; the manifest asset commits what
is recorded. The record is written atomically and removed after the commit, so a run that dies in
between leaves a record the next manifest step can still commit (commits are idempotent).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from resources.durable_files import write_json_atomic
from snapshot_assets.archive.manifest import Artifact, loads


def _path(root: Path, table: str) -> Path:
    return root / "_pending" / f"{table}.json"


def save_pending(root: Path, table: str, art: Artifact, info: dict[str, Any]) -> None:
    write_json_atomic(_path(root, table), {"artifact": art.to_json(), "info": info})


def load_pending(root: Path, table: str) -> tuple[Artifact, dict[str, Any]] | None:
    path = _path(root, table)
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    wrapper = {"manifest_version": 1, "table": table, "artifacts": [doc["artifact"]]}
    return loads(json.dumps(wrapper)).artifacts[0], dict(doc.get("info") or {})


def clear_pending(root: Path, table: str) -> None:
    _path(root, table).unlink(missing_ok=True)
