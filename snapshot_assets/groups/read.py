"""Reading a group at one cut: every member rebuilt at the newest cut at or before P.

Read-only by construction: the group manifest and the table manifests and artifacts are only
read (`Destination.get`, `open_read`, `list`), from the configuration's destinations; no buffer,
no working root, nothing written. In a row-by-row process (`read_group`, the CLI) each member is
folded by the project's reader; for large tables `reconstruct_group_to_paths` runs the Spark
reconstruct (spark/reconstruct.py) per member at the cut and writes each one to its own folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resources.aws_credentials import CredentialProfiles
from resources.destinations.base import Destination
from resources.destinations.factory import build_destination
from snapshot_assets.archive import keys
from snapshot_assets.archive.errors import ArchiveError, PositionError
from snapshot_assets.archive.manifest import Manifest
from snapshot_assets.archive.positions import comparator
from snapshot_assets.archive.reader import ArchiveReader, Reconstruction
from snapshot_assets.config import SnapshotterConfig, TableConfig
from snapshot_assets.groups.manifest import Cut, group_manifest_key, read_group_manifest
from snapshot_assets.groups.model import GroupConfig


class CutNotFound(PositionError):
    """The group has no cut at or before the requested position."""


def manifest_key_fields(m: Manifest) -> tuple[str, ...]:
    """The key a PostgreSQL table's manifest records in its `columns` (PrimaryKey, in key order)."""
    if not isinstance(m.columns, list):
        return ()
    keyed = [c for c in m.columns if isinstance(c, dict) and c.get("PrimaryKey")]
    keyed.sort(key=lambda c: int(c.get("PrimaryKeyOrdinal") or 0))
    return tuple(str(c["Name"]) for c in keyed)


@dataclass(frozen=True)
class GroupReader:
    """A group's manifest and one reader per member, on the first destination of each member."""

    group: GroupConfig
    destinations: tuple[Destination, ...]
    members: dict[str, tuple[TableConfig, Destination]]

    @classmethod
    def of(cls, config: SnapshotterConfig, name: str) -> GroupReader:
        group = config.group(name)
        key = group_manifest_key(group.key_prefix)
        unique: dict[str, Destination] = {}
        members: dict[str, tuple[TableConfig, Destination]] = {}
        for table_name in group.tables:
            table = config.table(table_name)
            profiles = CredentialProfiles.shared(table.credentials)
            dests = [build_destination(spec, profiles=profiles) for spec in table.destinations]
            for dest in dests:
                unique.setdefault(dest.uri(key), dest)
            members[table.name] = (table, dests[0])
        return cls(group, tuple(unique.values()), members)

    def cut(self, at: str | None) -> Cut:
        """The newest cut at or before `at` (the newest cut when None)."""
        cmp = comparator("lsn")
        if at is not None and cmp(at, "") <= 0:
            raise PositionError(f"{at!r} is not a PostgreSQL LSN (expected HI/LO in hex, e.g. 0/16B3748)")
        m = read_group_manifest(list(self.destinations), self.group.key_prefix, self.group.name, self.group.tables, cmp)
        cut = m.cut_at(at, cmp)
        if cut is None:
            first = f"its first cut is at {m.cuts[0].position}" if m.cuts else "it has published no cut"
            raise CutNotFound(f"group {self.group.name} has no cut at or before {at or 'the head'}: {first}")
        return cut

    def reader(self, table: str) -> tuple[ArchiveReader, Manifest]:
        cfg, dest = self.members[table]
        plain = ArchiveReader(dest, cfg.key_prefix, cmp=comparator("lsn"))
        m = plain.load_manifest()
        fields = cfg.key_fields or manifest_key_fields(m) or keys.DEFAULT_KEY_FIELDS
        return ArchiveReader(dest, cfg.key_prefix, key_fields=fields, cmp=comparator("lsn")), m


@dataclass(frozen=True)
class GroupRead:
    cut: Cut
    tables: dict[str, Reconstruction]


def read_group(config: SnapshotterConfig, name: str, at: str | None = None) -> GroupRead:
    """Every member of group `name` at the newest cut at or before `at` (rows in memory)."""
    cut, members = _members_at(config, name, at)
    out: dict[str, Reconstruction] = {}
    for table, reader, m, to_position in members:
        rec = reader.reconstruct_as_of(to_position, m)
        _check_rebuilt(name, cut, table, to_position, rec.position if rec else None)
        assert rec is not None
        out[table] = rec
    return GroupRead(cut, out)


def _members_at(config: SnapshotterConfig, name: str,
                at: str | None) -> tuple[Cut, Iterator[tuple[str, ArchiveReader, Manifest, str]]]:
    """The newest cut at or before `at`, and per member: its reader, manifest and position at the cut."""
    group = GroupReader.of(config, name)
    cut = group.cut(at)

    def members() -> Iterator[tuple[str, ArchiveReader, Manifest, str]]:
        for table in group.group.tables:
            reader, m = group.reader(table)
            yield table, reader, m, cut.tables[table].to_position

    return cut, members()


def _check_rebuilt(name: str, cut: Cut, table: str, to_position: str, rebuilt_at: str | None) -> None:
    """A member rebuilt at a position other than the cut's (or not at all) means retention pruned it."""
    if rebuilt_at != to_position:
        raise ArchiveError(f"group {name}: the cut at {cut.position} reads {table} at {to_position}, which "
                           f"its manifest can no longer rebuild (retention pruned it)")


def reconstruct_group_to_paths(spark: Any, config: SnapshotterConfig, name: str, at: str | None, out_dir: Path | str,
                               fmt: str = "parquet") -> tuple[Cut, dict[str, Any]]:
    """Every member at the cut, with Spark, each into `<out_dir>/<schema.table>` (spark/reconstruct.py)."""
    from snapshot_assets.spark.reconstruct import reconstruct_to_path

    cut, members = _members_at(config, name, at)
    done: dict[str, Any] = {}
    for table, reader, m, to_position in members:
        result = reconstruct_to_path(spark, reader, to_position, Path(out_dir) / table, fmt, manifest=m)
        _check_rebuilt(name, cut, table, to_position, result.position if result else None)
        done[table] = result
    return cut, done
