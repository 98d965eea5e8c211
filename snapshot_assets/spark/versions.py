"""A diff's versions object (archive/versions.py), written by the tasks beside the diff's own parts.

The net changes carry each key's version (`ver`, from `effects.key_versions`); each task writes the
lines `<key JSON>\\t<version>` of its key range as one piece, with Arrow (no per-row Python), staged
or sent into the uploads like the diff's formats. The driver writes piece 0, the TRUNCATE's line,
when the diff has one. A snapshot's versions object is made by the buckets instead (state.py), so
that a re-base copies the versions of untouched buckets with their bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from pyspark.sql import DataFrame

from snapshot_assets.archive import versions
from snapshot_assets.archive.versions import VERSIONS
from snapshot_assets.spark.parts import PART_DDL, StagedFormat, collect_parts, part_batch, task_index
from snapshot_assets.spark.pieces import PieceWriter, Uploads


def _piece(staging_dir: str | None, index: int, uploads: Uploads | None) -> PieceWriter:
    staged = None if staging_dir is None else Path(staging_dir) / VERSIONS / f"part-{index:05d}{versions.EXTENSION}"
    return PieceWriter(VERSIONS, index, staged=staged, uploads=uploads)


def _lines(batch: Any) -> Any:
    ver = pc.fill_null(batch.column("ver"), "")
    return pc.binary_join_element_wise(batch.column("key"), versions.SEP, ver, "\n", "")


def _task(batches: Iterable[Any], staging_dir: str | None, offset: int, uploads: Uploads | None) -> Iterator[Any]:
    from snapshot_assets.spark.state import concatenated

    piece: PieceWriter | None = None
    count = 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if piece is None:
                piece = _piece(staging_dir, task_index(offset), uploads)
            piece.stream.write(concatenated(_lines(batch)))
            count += batch.num_rows
    except BaseException:
        if piece is not None:
            piece.abort()
        raise
    if piece is None:
        yield part_batch([])
        return
    where, size = piece.close()
    yield part_batch([(VERSIONS, piece.piece, where, size, count)])


def diff_versions(net: DataFrame, staging_dir: Path | None, *, first_part: int, uploads: Uploads | None,
                  truncate: str | None) -> StagedFormat:
    """The versions object of a diff: `net` (key, ver) in key order, one piece per partition
    numbered from `first_part`; `truncate` is the TRUNCATE's version text when the diff has one
    (its line comes first, piece 0)."""
    local = None if staging_dir is None else str(staging_dir)
    func = functools.partial(_task, staging_dir=local, offset=first_part, uploads=uploads)
    reports: list[Any] = list(net.select("key", "ver").mapInArrow(func, PART_DDL).collect())
    if truncate is not None:
        piece = _piece(local, 0, uploads)
        piece.stream.write(f"{versions.TRUNCATE_KEY}{versions.SEP}{truncate}\n".encode())
        where, size = piece.close()
        reports.append(dict(zip(("format", "part", "path", "bytes", "count"), (VERSIONS, 0, where, size, 1),
                                strict=True)))
    staged, _ = collect_parts(reports, [VERSIONS], sent=uploads is not None)
    return staged[VERSIONS]


__all__ = ["diff_versions"]
