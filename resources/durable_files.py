"""Crash-safe small-file writes, shared by every piece of local state (outbox, counters, pending
records, the buffer index, the local destination): write a temp file beside the target, fsync it,
rename it over the target, fsync the directory. A reader sees the old or the new file, never a
part of one, and after the function returns the new file survives a power cut."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomic(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(value, sort_keys=True).encode())
