"""`restore`: the entry point the CLI and the Dagster job share (see the package docstring).

Which path writes the rows is decided from the manifest's counts before anything is read: the
snapshot's rows plus the changes after it (an upper bound of the table's size at the point). At
or below `stream_max_rows` (default `DEFAULT_STREAM_MAX_ROWS`) one process folds and streams the
table; above it Spark reconstructs the table and its tasks COPY in parallel, so no single process
holds it. Either way the rows land in a staging table that is swapped in by one transaction.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final

import psycopg2

from resources.destinations.base import Destination
from snapshot_assets.archive import keys
from snapshot_assets.archive.positions import Comparator, compare_lsn
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.config import SparkConfig
from snapshot_assets.restore.errors import RestoreError
from snapshot_assets.restore.point import RestorePoint, restore_point
from snapshot_assets.restore.stream import stream_copy
from snapshot_assets.restore.target import TableName, Target, pg_error

log = logging.getLogger(__name__)

#: Tables of at most this many rows (by the manifest's counts) are restored by one process.
DEFAULT_STREAM_MAX_ROWS: Final = 100_000

SparkOpener = Callable[[], AbstractContextManager[Any]]
"""Opens a Spark session for the large-table path (entered only when that path is taken)."""


@dataclass(frozen=True, slots=True)
class RestoreResult:
    table: str
    target: str
    position: str
    label: str | None
    rows: int
    path: str  # "stream" or "spark"
    replaced: bool
    cleaned: tuple[str, ...]  # staging tables of killed restores that were dropped first
    seconds: float

    def describe(self) -> str:
        point = f"label {self.label!r} ({self.position})" if self.label else self.position
        return (f"{self.table} at {point}: {self.rows} rows restored into {self.target} "
                f"({self.path}{', replaced' if self.replaced else ''}) in {self.seconds:.1f}s")


def restore_table(dest: Destination, key_prefix: str, *, into: str, label: str | None = None,
                  position: str | None = None, target_table: str | None = None, replace: bool = False,
                  stream_max_rows: int = DEFAULT_STREAM_MAX_ROWS, spark: SparkOpener | None = None,
                  formats: Sequence[str] | None = None, cmp: Comparator = compare_lsn,
                  fallback_key: Sequence[str] = keys.DEFAULT_KEY_FIELDS) -> RestoreResult:
    """Write the archive's table as of `label` or `position` into the PostgreSQL database `into`,
    as `target_table` (default: the archived table's name); see the module docstring."""
    if stream_max_rows < 0:
        raise RestoreError(f"stream_max_rows must be >= 0, got {stream_max_rows}")
    started = time.monotonic()
    manifest = ArchiveReader(dest, key_prefix, cmp=cmp).load_manifest()
    point = restore_point(manifest, label=label, position=position, cmp=cmp, fallback_key=fallback_key)
    reader = ArchiveReader(dest, key_prefix, formats=formats, key_fields=point.key_fields, cmp=cmp)
    name = TableName.parse(target_table or manifest.table)
    large = point.estimated_rows > stream_max_rows
    if large and spark is None:
        raise RestoreError(f"{manifest.table} may hold {point.estimated_rows} rows, more than stream_max_rows "
                           f"({stream_max_rows}), and no Spark session is available")
    with Target(into, name) as target:
        existed = target.exists()
        if existed and not replace:
            raise target.exists_error()
        cleaned = target.leftovers()
        for leftover in cleaned:
            log.warning("dropping %s, left by a restore of %s that did not finish", leftover, name)
            target.drop(leftover)
        staging = target.create_staging(point.columns)
        try:
            specs = target.column_specs(staging)
            if large:
                assert spark is not None
                rows = _spark_rows(spark, reader, point, into, staging, specs)
            else:
                rows = stream_copy(target.conn, staging, specs, reader, point.plan)
            target.swap_in(staging, point.key_fields, replace=replace)
        except psycopg2.Error as exc:
            _drop_quietly(target, staging)
            raise RestoreError(f"writing {name} failed: {pg_error(exc)}") from None
        except BaseException:
            _drop_quietly(target, staging)
            raise
    result = RestoreResult(manifest.table, str(name), point.position, point.label, rows, "spark" if large else "stream",
                           existed, tuple(str(t) for t in cleaned), time.monotonic() - started)
    log.info("%s", result.describe())
    return result


def _spark_rows(spark: SparkOpener, reader: ArchiveReader, point: RestorePoint, into: str, staging: TableName,
                specs: Sequence[tuple[str, str]]) -> int:
    from snapshot_assets.restore.spark_copy import spark_copy
    from snapshot_assets.spark.reconstruct import reconstruct_frame

    with spark() as session:
        table = reconstruct_frame(session, reader, point.plan)
        try:
            return spark_copy(table.frame, into, staging, specs)
        finally:
            table.release()


def _drop_quietly(target: Target, staging: TableName) -> None:
    """Drop the staging table after a failure; if even that fails, the next restore of the target does it."""
    try:
        target.drop(staging)
    except Exception as exc:
        log.warning("could not drop %s (%s); the next restore of %s drops it", staging, exc, target.name)


def spark_from_config(config: SparkConfig) -> SparkOpener:
    """A `SparkOpener` for the configuration's `spark` block (what `snapshotter run` uses)."""

    @contextlib.contextmanager
    def session() -> Iterator[Any]:
        from snapshot_assets.spark.session import open_spark

        runtime = open_spark(config)
        try:
            yield runtime.spark
        finally:
            runtime.stop()

    return session


def fixed_session(session: Any) -> SparkOpener:
    """A `SparkOpener` for a session someone else owns (a Dagster resource's, a test's)."""
    return lambda: contextlib.nullcontext(session)
