"""A local JSON-lines file sink: one compact event per line, fsynced before `publish` returns."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from resources.sinks.base import SinkError
from snapshot_assets.archive.gojson import marshal


class FileSink:
    def __init__(self, path: str | os.PathLike[str], name: str = "") -> None:
        self.path = Path(path)
        self.name = name or f"file:{self.path}"

    def publish(self, event: Mapping[str, Any]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as f:
                f.write(marshal(dict(event)) + b"\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise SinkError(f"{self.name}: cannot append to {self.path}: {e.strerror}") from e
