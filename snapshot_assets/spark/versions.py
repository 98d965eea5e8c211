"""A diff's versions object (archive/versions.py), written by the tasks beside the diff's own parts.

The net changes carry each key's version (`ver`, from `effects.key_versions`); each task that
encodes its key range's parts writes the lines `<key JSON>\\t<version>` of the same range as one
more piece, with Arrow (no per-row Python), staged or sent into the uploads like the diff's
formats. The driver writes piece 0, the TRUNCATE's line, when the diff has one. A snapshot's
versions object is made by the buckets instead (state.py), so that a re-base copies the versions
of untouched buckets with their bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from pyspark.sql import DataFrame

from snapshot_assets.archive import versions
from snapshot_assets.archive.versions import VERSIONS
from snapshot_assets.spark.parts import (
    PART_DDL,
    PartSink,
    StagedFormat,
    batch_changes,
    collect_parts,
    part_batch,
    task_index,
)
from snapshot_assets.spark.pieces import PieceWriter, Uploads


def _piece(staging_dir: str | None, index: int, uploads: Uploads | None) -> PieceWriter:
    staged = None if staging_dir is None else Path(staging_dir) / VERSIONS / f"part-{index:05d}{versions.EXTENSION}"
    return PieceWriter(VERSIONS, index, staged=staged, uploads=uploads)


def _lines(batch: Any) -> Any:
    ver = pc.fill_null(batch.column("ver"), "")
    return pc.binary_join_element_wise(batch.column("key"), versions.SEP, ver, "\n", "")


def _task(batches: Iterable[Any], staging_dir: str | None, formats: tuple[str, ...], key_fields: tuple[str, ...],
          offset: int, uploads: Uploads | None) -> Iterator[Any]:
    """One task's pieces: its net changes encoded in every record format (`parts.PartSink`) and
    their version lines, from the same batches (one pass over the task's key range)."""
    from snapshot_assets.spark.state import concatenated

    index = task_index(offset)
    sink = PartSink(staging_dir, formats, index, "diff", key_fields, uploads)
    piece: PieceWriter | None = None
    count = 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if piece is None:
                piece = _piece(staging_dir, index, uploads)
            piece.stream.write(concatenated(_lines(batch)))
            count += batch.num_rows
            for change, texts in batch_changes(batch):
                sink.write(change, texts)
        reports = sink.close()
    except BaseException:
        sink.abort()
        if piece is not None:
            piece.abort()
        raise
    if piece is not None:
        where, size = piece.close()
        reports.append((VERSIONS, index, where, size, count))
    yield part_batch(reports)


def encode_diff(net: DataFrame, staging_dir: Path | None, formats: Sequence[str], key_fields: Sequence[str], *,
                first_part: int, uploads: Uploads | None, truncate: str | None) -> tuple[list[Any], StagedFormat]:
    """A diff's record-format parts and its versions object, in one Spark job: `net` (NET_DDL rows)
    in key order, one piece per partition and format numbered from `first_part` (staged, or sent
    into `uploads`). Returns the format parts' report rows (the driver adds the TRUNCATE's part 0)
    and the versions object; `truncate` is the TRUNCATE's version text when the diff has one (its
    line comes first, piece 0).

    Why one job: the versions and the formats read the same sorted net changes; as two actions,
    Spark sampled the key range, shuffled and sorted them twice."""
    local = None if staging_dir is None else str(staging_dir)
    func = functools.partial(_task, staging_dir=local, formats=tuple(formats), key_fields=tuple(key_fields),
                             offset=first_part, uploads=uploads)
    reports: list[Any] = list(net.select("action", "change_key", "old", "new", "key", "ver")
                              .mapInArrow(func, PART_DDL).collect())
    if truncate is not None:
        piece = _piece(local, 0, uploads)
        piece.stream.write(f"{versions.TRUNCATE_KEY}{versions.SEP}{truncate}\n".encode())
        where, size = piece.close()
        reports.append(dict(zip(("format", "part", "path", "bytes", "count"), (VERSIONS, 0, where, size, 1),
                                strict=True)))
    staged, _ = collect_parts([r for r in reports if r["format"] == VERSIONS], [VERSIONS], sent=uploads is not None)
    return [r for r in reports if r["format"] != VERSIONS], staged[VERSIONS]


__all__ = ["encode_diff"]
