"""Builders for small archives on a real local destination, written with the project's writer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from resources.destinations.local import LocalDestination
from snapshot_assets.archive.changes import Change, Row
from snapshot_assets.archive.manifest import Artifact, Manifest
from snapshot_assets.archive.positions import compare_sequence
from snapshot_assets.archive.writer import ArtifactWriter
from snapshot_assets.pipeline.commit import commit_artifact

PREFIX = "public.events/"

Step = tuple[str, int, str | None, str, Sequence[Row] | Sequence[Change]]
BuildArchive = Callable[..., tuple[LocalDestination, Manifest]]


@pytest.fixture
def build_archive(tmp_path: Path) -> BuildArchive:
    """Write `steps` (kind, epoch, from, to, rows|changes) and commit each; returns (dest, manifest)."""

    def build(steps: Sequence[Step], formats: Sequence[str] = ("jsonl",), key_fields: Sequence[str] = ("id",),
              prefix: str = PREFIX) -> tuple[LocalDestination, Manifest]:
        dest = LocalDestination(tmp_path / "archive")
        writer = ArtifactWriter([dest], prefix, snapshot_formats=formats, diff_formats=formats,
                                key_fields=key_fields)
        m = Manifest(table="public.events")
        for kind, epoch, from_pos, to_pos, items in steps:
            art: Artifact
            if kind == "snapshot":
                art = writer.write_snapshot(epoch, to_pos, items)  # type: ignore[arg-type]
            else:
                assert from_pos is not None
                art = writer.write_diff(epoch, from_pos, to_pos, items)  # type: ignore[arg-type]
            m = commit_artifact([dest], prefix, "public.events", art, cmp=compare_sequence).manifest
        return dest, m

    return build
