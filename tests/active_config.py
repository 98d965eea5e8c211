"""Making a configuration file the code location's own for one test (what SNAPSHOTTER_CONFIG does for
a deployment): the cached config and pipelines are dropped before and after, so no test sees another's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshot_assets import tables
from snapshot_assets.config import SnapshotterConfig


def use_config(monkeypatch: pytest.MonkeyPatch, path: Path) -> Iterator[SnapshotterConfig]:
    """Yield the configuration at `path` as the active one (a fixture body: `yield from use_config(...)`)."""
    monkeypatch.setenv("SNAPSHOTTER_CONFIG", str(path))
    tables.config.cache_clear()
    tables.pipeline.cache_clear()
    try:
        yield tables.config()
    finally:
        tables.config.cache_clear()
        tables.pipeline.cache_clear()
