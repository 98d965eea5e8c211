"""get(key): one row of a table as of a position, read from the archive without rebuilding the table.

Plan (the same as reconstruct's, `reader.plan_as_of`): the snapshot with the greatest position at
or before P, then the diffs chained after it up to P. The snapshot part reads the snapshot's key
index (`key_index.py`) and the one range of its jsonl (or protobuf) object that can hold the key;
the diffs after it are read whole (they are small by construction: a re-base starts a new epoch
when they grow). A snapshot without an index (laredo's, or one written before this project kept
one) is scanned instead, which `LookupResult.note` says.

Read only by construction: the reader is given a `ReadableDestination` (get, read_range, open_read,
list), so no code path here can write; a principal that may only read the archive serves lookups.

Versions (archive/versions.py): the build keeps the position and commit time of each row's last
change beside the artifacts. A key found in the snapshot takes its version from the line of the
snapshot's versions object that stands where the row stands in its block (the key index holds the
block's offset in that object too: one more small range read); a key a diff after the snapshot
touched takes it from the versions object of the last such diff (one small object). An archive
written before versions were kept still answers, less exactly: `version` is then the end of the diff
window that holds the key's last change (`exact` False), or None for a key unchanged since the
snapshot (`unchanged_since`), and no commit time.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resources.destinations.base import ReadableDestination
from snapshot_assets.archive.algebra import key_effects
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.errors import ArchiveError, CorruptArtifact, MissingArtifact, PositionError
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.key_index import KeyIndex, UnusableIndex, index_key
from snapshot_assets.archive.keys import DEFAULT_KEY_FIELDS, TypedKey, key_json, typed_key
from snapshot_assets.archive.manifest import Artifact, Manifest
from snapshot_assets.archive.positions import Comparator, compare_lsn, parse_lsn
from snapshot_assets.archive.reader import ArchiveReader, artifact_key, plan_as_of
from snapshot_assets.archive.row_schema import ColumnType, RowSchema
from snapshot_assets.archive.sortkey import sort_key
from snapshot_assets.archive.versions import (
    TRUNCATE_KEY,
    VERSIONS,
    Version,
    diff_lines,
    diff_versions_key,
    line_at,
    parse_version,
    snapshot_versions_key,
)

#: Byte formats a lookup can read a range of, best first (parquet: the scan fallback only).
_RANGE_FORMATS = ("jsonl", "protobuf")


class BadKey(ArchiveError, ValueError):
    """The key given to a lookup does not fit the table's key fields (count or type)."""


@dataclass
class BytesRead:
    """What a lookup read, by purpose (its verbose output)."""

    index: int = 0
    ranges: int = 0
    scanned: int = 0
    diffs: int = 0
    versions: int = 0

    @property
    def total(self) -> int:
        return self.index + self.ranges + self.scanned + self.diffs + self.versions


@dataclass
class LookupResult:
    """One key as of `position` (the effective position: the last boundary at or before the one asked)."""

    key: TypedKey
    position: str
    row: Row | None
    version: str | None = None  # the position of the key's last change at or before `position`
    commit_time: str | None = None  # that change's commit time (None: unknown, or a copied row)
    copied: bool = False  # `version` is the initial load's (or a re-sync's) position: the row came from that copy
    exact: bool = False  # `version` comes from the versions objects (False: a diff window's end, or None)
    changed_after: str | None = None
    unchanged_since: str | None = None
    archived_at: str | None = None
    deleted_at: str | None = None
    used_index: bool = False
    snapshot_bytes: int = 0
    bytes_read: BytesRead = field(default_factory=BytesRead)
    notes: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return self.row is not None


def parse_key(values: Sequence[str], key_fields: Sequence[str], columns: Any = None) -> TypedKey:
    """The typed key of the values a person typed, one per key field, in key-field order.

    The manifest's `columns` (a PostgreSQL source) give each field's type; without them a decimal
    integer is read as an integer and anything else as a string (`candidates` adds the string
    reading too). Values are canonical the way stored rows are (`keys.typed_key`), so an integer
    beyond 2^53 stays exact.
    """
    if len(values) != len(key_fields):
        raise BadKey(f"{len(values)} key value(s) {list(values)} for key fields {list(key_fields)}: "
                     "give one --key per key field, in that order")
    schema = _schema(columns)
    typed = {f: _typed(f, v, schema) for f, v in zip(key_fields, values, strict=True)}
    return typed_key(typed, key_fields)


def candidates(values: Sequence[str], key_fields: Sequence[str], columns: Any = None) -> list[TypedKey]:
    """`parse_key`, and without column types also the all-strings reading when it differs."""
    first = parse_key(values, key_fields, columns)
    schema = _schema(columns)
    if schema is not None and all(_kind(f, schema) is not None for f in key_fields):
        return [first]
    as_text = tuple(values)
    return [first] if as_text == first else [first, as_text]


def _schema(columns: Any) -> RowSchema | None:
    if not columns:
        return None
    try:
        return RowSchema.from_manifest_columns(columns)
    except ArchiveError:
        return None


def _kind(name: str, schema: RowSchema | None) -> ColumnType | None:
    """The key field's type when the manifest's columns say (None: not described, or JSON: unknown)."""
    if schema is None:
        return None
    try:
        kind = schema.type_of(name)
    except KeyError:
        raise BadKey(f"key field {name!r} is not a column of the table ({', '.join(schema.names)})") from None
    return None if kind is ColumnType.JSON else kind


def _typed(name: str, text: str, schema: RowSchema | None) -> Any:
    kind = _kind(name, schema)
    if kind in (ColumnType.INT16, ColumnType.INT32, ColumnType.INT64) or (kind is None and _is_int(text)):
        if not _is_int(text):
            raise BadKey(f"key field {name!r} holds integers; {text!r} is not one")
        return int(text)
    if kind is ColumnType.FLOAT64:
        try:
            value = float(text)
        except ValueError:
            raise BadKey(f"key field {name!r} holds numbers; {text!r} is not one") from None
        if not math.isfinite(value):
            raise BadKey(f"key field {name!r}: {text!r} cannot be a key")
        return value
    if kind is ColumnType.BOOL:
        if text not in ("true", "false"):
            raise BadKey(f"key field {name!r} holds booleans; {text!r} is neither true nor false")
        return text == "true"
    return text


def _is_int(text: str) -> bool:
    body = text[1:] if text[:1] == "-" else text
    return body.isascii() and body.isdigit()


class Lookup:
    """Answers get(key) for one table's archive on one destination (read only)."""

    def __init__(self, reader: ArchiveReader) -> None:
        self.reader = reader
        self.dest = reader.dest

    def get(self, key: TypedKey | Sequence[TypedKey], position: str | None = None,
            manifest: Manifest | None = None) -> LookupResult:
        """The row of `key` (or of the first of several candidate readings that the archive holds)
        as of `position` (the head when None). PositionError when the archive cannot reach it."""
        wanted = [key] if isinstance(key, tuple) else list(key)
        m = manifest or self.reader.load_manifest()
        at = m.head_position if position is None else position
        if position is not None and self.reader.cmp is compare_lsn and parse_lsn(position) is None:
            raise PositionError(f"{position!r} is not a PostgreSQL LSN (expected HI/LO in hex, e.g. 0/16B3748)")
        plan = plan_as_of(m, at, self.reader.cmp)
        if plan is None or plan.snapshot is None:
            first = next(m.snapshots(), None)
            reach = f"its first snapshot is at {first.to_position}" if first else "it holds no snapshot"
            raise PositionError(f"the archive cannot reach position {at}: {reach}")
        results = []
        diffs = self._diffs(plan.diffs)
        for candidate in wanted:
            result = self._snapshot_row(plan.snapshot, candidate, plan.head_position)
            last: tuple[Artifact, bool] | None = None
            for art, changes in diffs:
                result.bytes_read.diffs += self._size(art)
                touched = _apply(result, art, changes, self.reader.key_fields)
                last = (art, touched) if touched is not None else last
            if last is not None:
                self._diff_version(result, *last)
            if result.found or result.version is not None:
                return result
            results.append(result)
        return results[0]

    def _diff_version(self, result: LookupResult, art: Artifact, by_key: bool) -> None:
        """The version of the key's last change from the versions object of the diff that holds it
        (`by_key` False: the diff's TRUNCATE removed the key)."""
        where = diff_versions_key(self.reader.key_prefix, art.epoch, art.from_position or "", art.to_position)
        got = self.dest.get(where)
        if got is None:
            result.notes.append(f"{art.describe()} has no versions object: the version is the diff's end")
            return
        result.bytes_read.versions += len(got.data)
        lines = diff_lines(got.data, self.dest.uri(where))
        name = key_json(result.key) if by_key else TRUNCATE_KEY
        if name not in lines:
            raise MissingArtifact(f"{self.dest.uri(where)} lacks the version of key {name or 'TRUNCATE'}, "
                                  f"which {art.describe()} changed")
        _set_version(result, lines[name])
        if result.row is None:
            result.deleted_at = result.version

    # ---- the snapshot -------------------------------------------------------------------------

    def _snapshot_row(self, snap: Artifact, key: TypedKey, position: str) -> LookupResult:
        result = LookupResult(key, position, None, unchanged_since=snap.to_position)
        index = self._index(snap, result)
        fid = next((f for f in _RANGE_FORMATS if index is not None and f in index.offsets and f in snap.formats),
                   None)
        if index is None or fid is None:
            result.row = self._scan(snap, key, result)
            return result
        result.used_index = True
        result.snapshot_bytes = snap.formats[fid].size_bytes
        entry = index.entry(sort_key(key))
        if entry is None:
            return result
        start, length = index.span(entry, fid)
        data = self._range(artifact_key(self.reader.key_prefix, snap, FORMATS[fid]), start, length, snap)
        result.bytes_read.ranges += len(data)
        ordinal, result.row = _find(FORMATS[fid].read_snapshot(io.BytesIO(data)), key, self.reader.key_fields)
        if result.row is not None and VERSIONS in index.offsets:
            where = snapshot_versions_key(self.reader.key_prefix, snap.epoch, snap.to_position)
            versions = self._range(where, *index.span(entry, VERSIONS), snap)
            result.bytes_read.versions += len(versions)
            _set_version(result, line_at(versions, ordinal, self.dest.uri(where)))
        return result

    def _range(self, key: str, start: int, length: int, snap: Artifact) -> bytes:
        try:
            return self.dest.read_range(key, start, length)
        except FileNotFoundError:
            raise MissingArtifact(f"{snap.describe()}: object missing: {self.dest.uri(key)}") from None

    def _index(self, snap: Artifact, result: LookupResult) -> KeyIndex | None:
        """The snapshot's key index when it has a usable one (else a note saying why not)."""
        key = index_key(self.reader.key_prefix, snap.epoch, snap.to_position)
        got = self.dest.get(key)
        if got is None:
            result.notes.append(f"{snap.describe()} has no key index: scanning the snapshot")
            return None
        result.bytes_read.index += len(got.data)
        try:
            index = KeyIndex.loads(got.data, self.dest.uri(key))
        except UnusableIndex as exc:
            result.notes.append(f"{exc}: scanning the snapshot")
            return None
        if index.key_fields != self.reader.key_fields:
            raise BadKey(f"the archive is keyed by {list(index.key_fields)}, not {list(self.reader.key_fields)}: "
                         "pass the table's key columns with --key-fields")
        stale = [f for f, size in index.sizes.items() if f in snap.formats and snap.formats[f].size_bytes != size]
        if index.position != snap.to_position or stale:
            result.notes.append(f"the key index at {self.dest.uri(key)} does not describe {snap.describe()}: "
                                "scanning the snapshot")
            return None
        return index

    def _scan(self, snap: Artifact, key: TypedKey, result: LookupResult) -> Row | None:
        fmt = self.reader.format_for(snap)
        result.bytes_read.scanned += snap.formats[fmt.format_id].size_bytes if fmt.format_id in snap.formats else 0
        result.snapshot_bytes = result.bytes_read.scanned
        ordinal, row = _find(self.reader.iter_snapshot(snap), key, self.reader.key_fields)
        if row is not None:  # every format holds the rows in one order: the row's line is its ordinal's
            self._scan_version(snapshot_versions_key(self.reader.key_prefix, snap.epoch, snap.to_position), ordinal,
                               result)
        return row

    def _scan_version(self, where: str, ordinal: int, result: LookupResult) -> None:
        """Line `ordinal` of a snapshot's versions object, streamed (no index to say where it is)."""
        try:
            stream = self.dest.open_read(where)
        except FileNotFoundError:
            return  # a snapshot built before versions were kept
        with stream:
            for n, line in enumerate(stream):
                result.bytes_read.versions += len(line)
                if n == ordinal:
                    _set_version(result, parse_version(line.decode("utf-8").rstrip("\n"), self.dest.uri(where)))
                    return
        raise CorruptArtifact(f"{self.dest.uri(where)}: fewer version lines than the snapshot has rows")

    # ---- the diffs after it -------------------------------------------------------------------

    def _size(self, art: Artifact) -> int:
        """The bytes of the object a diff is read from (the reader's format choice)."""
        return art.formats[self.reader.format_for(art).format_id].size_bytes

    def _diffs(self, arts: Sequence[Artifact]) -> list[tuple[Artifact, list[Change]]]:
        """Each diff's changes, read once for every candidate key."""
        return [(art, list(self.reader.iter_diff(art))) for art in arts]


def _find(rows: Iterable[Row], key: TypedKey, key_fields: Sequence[str]) -> tuple[int, Row | None]:
    """The row of `key` among `rows` and its ordinal there ((-1, None): not there)."""
    for ordinal, row in enumerate(rows):
        if typed_key(row, key_fields) == key:
            return ordinal, row
    return -1, None


def _set_version(result: LookupResult, version: Version | None) -> None:
    """Take an exact version (None: the versions object says unknown, which leaves the result as is)."""
    if version is None:
        return
    result.version, result.commit_time, result.copied, result.exact = (version.position, version.commit_time,
                                                                       version.copied, True)


def _apply(result: LookupResult, art: Artifact, changes: Iterable[Change],
           key_fields: Sequence[str]) -> bool | None:
    """Fold one diff into the key's row, the reader's way (`fold.fold_diff`): a TRUNCATE anywhere in
    the diff applies before the diff's other changes. Whether the diff changed the key by a change
    of its own (True) or only by its TRUNCATE (False); None when it left the key alone."""
    touched = truncated = False
    after: Row | None = None
    for change in changes:
        if change.action is Action.TRUNCATE:
            truncated = True
            continue
        for effect in key_effects(change, key_fields):
            if effect.key == result.key:
                touched, after = True, effect.after
    if not touched and not (truncated and result.row is not None):
        return None
    result.row = after if touched else None
    result.version, result.changed_after, result.archived_at = art.to_position, art.from_position, art.created_at
    result.commit_time, result.copied, result.exact = None, False, False
    result.unchanged_since = None
    result.deleted_at = art.to_position if result.row is None else None
    return touched


def describe(result: LookupResult) -> Mapping[str, Any]:
    """The result as the CLI prints it (JSON-ready; the row as the archive holds it)."""
    out: dict[str, Any] = {"key": list(result.key), "position": result.position, "found": result.found,
                           "row": result.row}
    if result.version is not None:
        out["version"] = result.version
        out["commit_time"] = result.commit_time
        if result.copied:
            out["copied"] = True  # the row is as the initial load (or a re-sync) copied it at `version`
        if not result.exact:
            out["version_exact"] = False  # an archive without versions: the end of the diff holding the change
    if result.changed_after is not None:
        out["changed_after"] = result.changed_after
        out["archived_at"] = result.archived_at
    else:
        out["unchanged_since"] = result.unchanged_since
    if result.deleted_at is not None:
        out["deleted_at"] = result.deleted_at
    return out


def explain(result: LookupResult) -> str:
    """The verbose account of a lookup: how the snapshot part was found and every byte read."""
    read = result.bytes_read
    how = "key index + one range" if result.used_index else "snapshot scanned (no usable key index)"
    share = f" ({100 * (read.total - read.diffs) / result.snapshot_bytes:.3f}% of the snapshot)" \
        if result.snapshot_bytes else ""
    lines = [*result.notes,
             f"{how}; bytes read: {read.total} = index {read.index} + ranges {read.ranges} + scanned {read.scanned} "
             f"+ diffs {read.diffs} + versions {read.versions}; snapshot object {result.snapshot_bytes} bytes{share}"]
    if result.exact and result.copied:
        lines.append(f"unchanged since the copy the archive started from at {result.version} "
                     "(its last change before that is not known to the archive)")
    elif result.exact:
        lines.append(f"last change at {result.version}, committed at {result.commit_time or '(not given)'}")
    elif result.version is not None:
        lines.append(f"last change in the diff ({result.changed_after}, {result.version}], archived at "
                     f"{result.archived_at}; this archive keeps no versions object for it")
    elif result.found:
        lines.append(f"unchanged since the snapshot at {result.unchanged_since}; this archive keeps no versions "
                     "object for it")
    return "\n".join(lines)


def get(dest: ReadableDestination, key_prefix: str, values: Sequence[str], *, key_fields: Sequence[str] | None = None,
        at: str | None = None, cmp: Comparator = compare_lsn) -> LookupResult:
    """The row whose key fields hold `values` (as typed text, one per field) as of `at` (head when
    None) in the archive at `key_prefix` of `dest`. Key fields: `key_fields`, else the manifest's
    primary key, else laredo's `id`."""
    m = ArchiveReader(dest, key_prefix, cmp=cmp).load_manifest()
    fields = tuple(key_fields) if key_fields else key_fields_of(m) or DEFAULT_KEY_FIELDS
    reader = ArchiveReader(dest, key_prefix, key_fields=fields, cmp=cmp)
    return Lookup(reader).get(candidates(values, fields, m.columns), at, m)


def key_fields_of(m: Manifest) -> tuple[str, ...] | None:
    """The key fields the manifest's columns declare (laredo's PrimaryKey/PrimaryKeyOrdinal), if any."""
    if not m.columns:
        return None
    try:
        primary = sorted((int(c.get("PrimaryKeyOrdinal") or 0), str(c["Name"])) for c in m.columns
                         if c.get("PrimaryKey"))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return tuple(name for _, name in primary) or None


__all__ = ["BadKey", "BytesRead", "Lookup", "LookupResult", "candidates", "describe", "explain", "get", "key_fields_of",
           "parse_key"]
