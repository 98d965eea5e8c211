"""A diff's pieces: each task's share of the diff's record-format objects and of its versions object.

The delta holds each net change's records, encoded once as the changes entered (diff_records.py),
and its version (`ver`, from `effects.key_versions`). The net changes are read in key order; each
task writes, for its key range, one piece per record format (its records back to back) and one of
the versions object (the lines `<key JSON>\\t<version>`), all stored bytes joined with Arrow (no
per-change Python), staged or sent into the uploads. The driver writes piece 0 of the versions
object, the TRUNCATE's line, when the diff has one (and diff.py the TRUNCATE's record). A
snapshot's versions object is made by the buckets instead (state.py), so that a re-base copies the
versions of untouched buckets with their bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from pyspark.sql import DataFrame

from snapshot_assets.archive import versions
from snapshot_assets.archive.formats import get_format
from snapshot_assets.archive.versions import VERSIONS
from snapshot_assets.spark.diff_records import RECORD_COLUMNS
from snapshot_assets.spark.parts import PART_DDL, StagedFormat, collect_parts, part_batch, part_path, task_index
from snapshot_assets.spark.pieces import PieceWriter, Uploads
from snapshot_assets.spark.state import concatenated


def _piece(staging_dir: str | None, format_id: str, extension: str, index: int, uploads: Uploads | None) -> PieceWriter:
    staged = None if staging_dir is None else part_path(staging_dir, format_id, extension, index)
    return PieceWriter(format_id, index, staged=staged, uploads=uploads)


def _lines(batch: Any) -> Any:
    ver = pc.fill_null(batch.column("ver"), "")
    return pc.binary_join_element_wise(batch.column("key"), versions.SEP, ver, "\n", "")


def _column(batch: Any, name: str) -> Any:
    return batch.column(name)


#: Each piece format of a diff: its extension and how a batch of the delta's records becomes its bytes.
_PIECES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    **{fid: (get_format(fid).extension, functools.partial(_column, name=column))
       for fid, column in RECORD_COLUMNS.items()},
    VERSIONS: (versions.EXTENSION, _lines),
}


def _task(batches: Iterable[Any], staging_dir: str | None, formats: tuple[str, ...], offset: int,
          uploads: Uploads | None) -> Iterator[Any]:
    """One task's pieces: its net changes' stored records in every record format and their version
    lines, from the same batches (one pass over the task's key range, stored bytes only)."""
    index = task_index(offset)
    pieces: list[PieceWriter] = []
    count = 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if not pieces:
                pieces = [_piece(staging_dir, fid, _PIECES[fid][0], index, uploads) for fid in (*formats, VERSIONS)]
            for piece in pieces:
                piece.stream.write(concatenated(_PIECES[piece.format_id][1](batch)))
            count += batch.num_rows
        reports = []
        for piece in pieces:
            where, size = piece.close()
            reports.append((piece.format_id, index, where, size, count))
    except BaseException:
        for piece in pieces:
            piece.abort()
        raise
    yield part_batch(reports)


def encode_diff(records: DataFrame, staging_dir: Path | None, formats: Sequence[str], *, first_part: int,
                uploads: Uploads | None, truncate: str | None) -> tuple[list[Any], StagedFormat]:
    """A diff's record-format parts and its versions object, in one Spark job: `records` (the
    delta's `DeltaSet.record_frame`: key, ver and each format's record column) in key order, one
    piece per partition and format numbered from `first_part` (staged, or sent into `uploads`).
    Returns the format parts' report rows (the driver adds the TRUNCATE's part 0) and the versions
    object; `truncate` is the TRUNCATE's version text when the diff has one (its line comes first,
    piece 0).

    Why one job: the versions and the formats read the same sorted net changes; as two actions,
    Spark sampled the key range, shuffled and sorted them twice."""
    local = None if staging_dir is None else str(staging_dir)
    func = functools.partial(_task, staging_dir=local, formats=tuple(formats), offset=first_part, uploads=uploads)
    reports: list[Any] = list(records.mapInArrow(func, PART_DDL).collect())
    if truncate is not None:
        piece = _piece(local, VERSIONS, versions.EXTENSION, 0, uploads)
        piece.stream.write(f"{versions.TRUNCATE_KEY}{versions.SEP}{truncate}\n".encode())
        where, size = piece.close()
        reports.append(dict(zip(("format", "part", "path", "bytes", "count"), (VERSIONS, 0, where, size, 1),
                                strict=True)))
    staged, _ = collect_parts([r for r in reports if r["format"] == VERSIONS], [VERSIONS], sent=uploads is not None)
    return [r for r in reports if r["format"] != VERSIONS], staged[VERSIONS]


__all__ = ["encode_diff"]
