"""What a restore writes, decided from the manifest alone: the artifacts that rebuild the table at
the chosen point, the table's columns (laredo's ColumnDefinition as the PostgreSQL source wrote
them) and its key.

A label names a pinned snapshot (`archive.pins`): the restore is that snapshot, exactly, with no
diff after it. A position is read as of it (`reader.plan_as_of`): the newest snapshot at or before
it and the diffs chained after it up to it; the table is then as it was at the last artifact
boundary at or before the position, which the result names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snapshot_assets.archive import keys
from snapshot_assets.archive.errors import PositionError
from snapshot_assets.archive.manifest import Manifest
from snapshot_assets.archive.pins import snapshot_labelled
from snapshot_assets.archive.positions import Comparator, compare_lsn, parse_lsn
from snapshot_assets.archive.reader import ReplayPlan, plan_as_of
from snapshot_assets.restore.errors import RestoreError


@dataclass(frozen=True, slots=True)
class TargetColumn:
    """One column of the restored table: its name, its type as the source's `format_type` printed
    it (e.g. `numeric(12,2)`, `timestamp with time zone`, `integer[]`), and whether it takes NULL."""

    name: str
    type_sql: str
    nullable: bool


@dataclass(frozen=True, slots=True)
class RestorePoint:
    """The archive's side of a restore: `plan` rebuilds `table` at `position` with `columns`."""

    table: str
    plan: ReplayPlan
    label: str | None
    columns: tuple[TargetColumn, ...]
    key_fields: tuple[str, ...]

    @property
    def position(self) -> str:
        return self.plan.head_position

    @property
    def estimated_rows(self) -> int:
        """At most this many rows: the snapshot's rows plus every change after it (the manifest's
        counts; nothing is read)."""
        snap = self.plan.snapshot.row_count if self.plan.snapshot is not None else 0
        return snap + sum(d.change_count for d in self.plan.diffs)


def table_columns(m: Manifest) -> tuple[TargetColumn, ...]:
    """The manifest's columns in ordinal order; a RestoreError when it has none (a source that does
    not describe its columns: nothing says which PostgreSQL types the values had)."""
    described: Any = m.columns
    if not described:
        raise RestoreError(f"the manifest of {m.table or 'the table'} has no column definitions (its source "
                           "did not describe the table's columns), so its PostgreSQL types are unknown")
    try:
        ordered: list[Mapping[str, Any]] = sorted(described, key=lambda c: int(c.get("OrdinalPosition") or 0))
        return tuple(TargetColumn(str(c["Name"]), str(c["Type"]), bool(c.get("Nullable", True))) for c in ordered)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RestoreError(f"the manifest of {m.table or 'the table'} has unreadable column definitions: "
                           f"{exc!r}") from None


def key_fields_of(m: Manifest, fallback: Sequence[str] = keys.DEFAULT_KEY_FIELDS) -> tuple[str, ...]:
    """The key the source reported (the columns marked PrimaryKey, in PrimaryKeyOrdinal order): the
    key the archive's rows are folded by and the restored table's primary key; `fallback` when the
    manifest marks none."""
    marked = [c for c in (m.columns or []) if isinstance(c, Mapping) and c.get("PrimaryKey")]
    marked.sort(key=lambda c: int(c.get("PrimaryKeyOrdinal") or 0))
    return tuple(str(c["Name"]) for c in marked) or tuple(fallback)


def restore_point(m: Manifest, *, label: str | None = None, position: str | None = None,
                  cmp: Comparator = compare_lsn, fallback_key: Sequence[str] = keys.DEFAULT_KEY_FIELDS
                  ) -> RestorePoint:
    """The point to restore: exactly one of `label` and `position`."""
    if (label is None) == (position is None):
        raise RestoreError("name the point to restore: a label or a position (exactly one)")
    columns = table_columns(m)
    key_fields = key_fields_of(m, fallback_key)
    missing = [k for k in key_fields if k not in {c.name for c in columns}]
    if missing:
        raise RestoreError(f"the key {list(key_fields)} of {m.table} names columns the manifest does not "
                           f"describe: {missing}")
    if label is not None:
        try:
            snap = snapshot_labelled(m, label)
        except PositionError as exc:
            raise RestoreError(str(exc)) from None
        return RestorePoint(m.table, ReplayPlan(snap, (), snap.to_position), label, columns, key_fields)
    assert position is not None
    if cmp is compare_lsn and parse_lsn(position) is None:
        raise RestoreError(f"{position!r} is not a PostgreSQL LSN (expected HI/LO in hex, e.g. 0/16B3748)")
    plan = plan_as_of(m, position, cmp)
    if plan is None or plan.snapshot is None:
        first = min((a.to_position for a in m.snapshots()), default=None,
                    key=lambda p: _Ordered(p, cmp))
        reach = f"its first snapshot is at {first}" if first else "it holds no snapshot"
        raise RestoreError(f"the archive of {m.table} cannot restore position {position}: {reach}")
    return RestorePoint(m.table, plan, None, columns, key_fields)


@dataclass(frozen=True, slots=True)
class _Ordered:
    """A position ordered by the archive's comparator (for min/max)."""

    value: str
    cmp: Comparator

    def __lt__(self, other: _Ordered) -> bool:
        return self.cmp(self.value, other.value) < 0
