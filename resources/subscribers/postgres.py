"""PostgreSQL source: logical replication with the built-in `pgoutput` plugin, no extension needed.

What it guarantees, and how:
- Gapless start. The slot is created with `EXPORT_SNAPSHOT` and the table is copied inside that
  exported snapshot on a second connection, so the copy holds exactly the transactions that
  committed before the slot's consistent point C and the stream holds exactly those from C on.
  The copy is announced as consistent at position C-1 ("every transaction whose commit record
  starts at or before C-1"): C is the end of the WAL record that made the snapshot consistent,
  so a commit record can start exactly at C. Announcing C itself would make a later resume from
  C skip that transaction.
- Positions. Every change carries its transaction's commit LSN (`%X/%08X`, the LSN of the commit
  record), all changes of a transaction share it, and a `TxEnd` with the same position follows
  its last change. A transaction that touches no row of the table yields nothing (no empty
  boundary). Resuming from P skips every transaction whose commit LSN is <= P: the slot re-sends
  the transaction at exactly its confirmed position.
- No client-side transaction buffer. Without the `streaming` option (protocol version 1) the
  server sends a transaction only after decoding its commit, and `Begin` already carries the
  commit LSN and time, so changes are emitted as they arrive and memory stays O(1) however big the
  transaction. The server spills big transactions to disk (`logical_decoding_work_mem`). If the
  stream breaks inside a transaction, its `TxEnd` never comes: the consumer drops that tail, and a
  resume from the last durable position replays the whole transaction.
- Acknowledgement. `acknowledge(P)` confirms flush up to P to the slot (it refuses positions this
  source never reached); psycopg2 resends the last confirmed position every `status_interval`.
  psycopg2 itself also moves the flush position to the server's WAL end on a keepalive when every
  data message it received has been confirmed (before the first data message of a session, or
  when the last message is a transaction's commit at or below the confirmed position). With
  commit-LSN positions the second case cannot arise (a Commit message is sent at its end LSN,
  beyond its commit LSN), and the first only confirms WAL in which the publication had nothing
  to send, so no change of the table is ever released before the caller says it is durable.
- Unchanged TOASTed values. An UPDATE that leaves a large out-of-line value alone does not resend
  it. Under REPLICA IDENTITY FULL the old tuple carries it and the new row is completed here.
  Otherwise the value is unknown to the stream, and any lookup would be wrong (the row may have
  changed since) or unbounded (a cache of every row). The event's `new` then lacks those columns
  and its `unchanged` names them; the archive fills them from its own previous image of the row
  (the previous change of that key, or the state the build starts from: spark/images.py).
  `fill_unchanged` is the same rule for one event, for single-process readers and tests. With
  `unchanged_toast="require-full"` the source refuses such tables at start instead.
- Type fidelity: see `pgtypes`; the copy reads every column as its output text (no psycopg2 type
  casting) and the stream's text goes through the same converter, so both agree for every type.
  The stream's changes keep that text (`text_rows.TextChange`, typed when read): the buffer stores
  it and the build converts it, which keeps conversion off the path that must keep up with the slot.

- Schema changes (ALTER TABLE ADD/DROP COLUMN, a column type change). pgoutput announces a new
  shape with a Relation message before the first change that uses it; the rows the archive holds
  keep the old shape (after `ADD COLUMN ... DEFAULT 5` every existing row reads 5 at the source,
  after a type change every value is converted), and only the source knows them. So the first
  change of a new shape makes the source re-sync the table (reason `SCHEMA_CHANGE`): `ResyncBegin`
  (the buffer seals every complete transaction before it and drops the partial one), a copy in
  a snapshot exported by a TEMPORARY slot, with the shape read from the catalog inside that same
  snapshot, then the stream again from the copy's position. The table's own slot is never
  dropped: it still holds everything after the last durable position, so a crash at any instant
  of the re-sync resumes there and meets the same change again, and the temporary slot vanishes
  with its connection. Which shape the durable rows have is the buffer's to say
  (`resume_schema`): after a restart the stream only shows shapes of changes after the resume
  position, and an ALTER TABLE just before it would otherwise go unnoticed.

- Idle progress (`progress=True`, for tables in a co-refresh group). A transaction that touches
  no row of the table yields nothing, so the durable position of an idle table stays at its last
  change while other tables move on, and a group watermark (every member complete through W)
  would wait for it. The walsender's keepalive carries its sent position S (`sentPtr`, the end
  of the last WAL record it decoded, which psycopg2 exposes as `cursor.wal_end`): every
  transaction whose commit record starts before S has been sent by then. So between
  transactions, a keepalive that moved S on yields `TxEnd(S-1)` with no changes: "nothing of this
  table committed through S-1", which the buffer makes its durable position like any other
  transaction end (a commit record is longer than one byte, so no transaction commits at S-1
  itself). Without the option nothing changes: positions stay the commit LSNs of the table's own
  transactions.

Starting with no position (`events(None)`) always makes a new slot: an existing slot of that name
is dropped first (it is left over from a load that never became durable), so slot names must be
unique per table.

Keys. A row's key is the table's primary key, or under REPLICA IDENTITY USING INDEX that index's
columns (the only columns a DELETE or a key-changing UPDATE carries in its before-image; the index is
unique and NOT NULL, so it names rows as well as the primary key does). The schema this source
reports marks those columns as the key. Configured `key_fields` must equal it, in order: a
mismatch stops the start (`KeyMismatch`) before any slot is touched. REPLICA IDENTITY NOTHING is
refused; generated columns are not published by pgoutput and are not copied either.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import select
import tempfile
import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
import pyarrow as pa
from psycopg2 import sql

from resources.subscribers import pgoutput, pgtypes
from resources.subscribers.errors import (
    KeyMismatch,
    NoPrimaryKey,
    ProtocolError,
    SlotInUse,
    SlotLost,
    SourceConfigError,
    SourceError,
    SourceUnavailable,
    UnknownTable,
)
from resources.subscribers.events import (
    SCHEMA_CHANGE,
    ChangeEvent,
    Column,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotBatch,
    TableSchema,
    TxEnd,
)
from resources.subscribers.text_columns import COPY_BLOCK_BYTES, copy_text_batches
from resources.subscribers.text_rows import RowCodec, TextChange, TextSnapshotRow, TextValues
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.positions import format_lsn, parse_lsn
from snapshot_assets.config import UNCHANGED_TOAST_POLICIES
from snapshot_assets.redaction import dsn_problem

Connection = Any  # a psycopg2 connection (the package ships no type information)

_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
# Storage modes that let PostgreSQL move a value out of line into the TOAST table.
_TOASTABLE_STORAGE: Final = frozenset({"x", "e", "m"})
_PERMANENT_CONNECT_FAILURES: Final = (
    "authentication failed", "does not exist", "no pg_hba.conf entry", "permission denied",
    "must be superuser", "must have replication", "invalid dsn", "invalid connection option",
    "wal_level",
)


def fill_unchanged(event: ChangeEvent, previous: Row | None) -> ChangeEvent:
    """Complete an UPDATE that omits unchanged columns from the previous image of its row (that of the
    old key when the key changed); other events pass through."""
    unchanged = event.unchanged
    if not unchanged:
        return event
    missing = [name for name in unchanged if previous is None or name not in previous]
    if missing or previous is None or event.new is None:
        raise ValueError(f"cannot restore unchanged TOASTed columns {missing} at {event.position}: "
                         "no previous image of the row holds them")
    new = dict(event.new)
    new.update({name: previous[name] for name in unchanged})
    return ChangeEvent(position=event.position, action=event.action, old=event.old, new=new,
                       commit_time=event.commit_time, sequence=event.sequence)


@dataclass(frozen=True, slots=True)
class _CatalogColumn:
    name: str
    type_oid: int
    type_modifier: int
    type_name: str
    not_null: bool
    attnum: int
    storage: str
    default: str | None = None


# Types whose type modifier is a declared length: (var)char count it with a 4-byte header, bit(n)
# and varbit(n) do not. laredo's MaxLength is 0 for everything else (unlimited).
_LENGTH_HEADER: Final = {1042: 4, 1043: 4, 1560: 0, 1562: 0}


def _max_length(type_oid: int, type_modifier: int) -> int:
    header = _LENGTH_HEADER.get(type_oid)
    return type_modifier - header if header is not None and type_modifier > header else 0


class _ShapeChanged(Exception):
    """A signal inside the source (never raised to a caller): the stream reached a change whose
    table shape is not the one of the rows the caller holds."""


@dataclass(frozen=True, slots=True)
class _TableInfo:
    oid: int
    replica_identity: str
    columns: tuple[_CatalogColumn, ...]
    primary_key: tuple[str, ...]
    key: tuple[str, ...]  # what names a row: the replica identity index under USING INDEX, else the primary key


@dataclass(frozen=True, slots=True)
class _SlotInfo:
    plugin: str | None
    database: str | None
    wal_status: str | None


class _Shape:
    """How to read one relation's tuples: column names, key columns, and the codec that types them."""

    __slots__ = ("codec", "key", "names", "signature")

    def __init__(self, columns: Sequence[tuple[str, int, int]], key: Sequence[str],
                 converters: pgtypes.Converters) -> None:
        self.signature = tuple(columns)
        self.names = tuple(name for name, _, _ in columns)
        self.key = tuple(key)
        self.codec = RowCodec(self.names, tuple(converters.spec(oid) for _, oid, _ in columns), self.key)

    def texts(self, values: pgoutput.TupleData) -> tuple[TextValues, tuple[str, ...]]:
        """Stream tuple data as column texts (None for an unchanged-TOAST column too), and the names
        of the unchanged-TOAST columns."""
        if len(values) != len(self.names):
            raise pgoutput.PgOutputError(f"tuple has {len(values)} columns, relation has {len(self.names)}")
        marker = pgoutput.UNCHANGED
        if marker not in values:
            return values, ()  # type: ignore[return-value]  # no marker: only text and None
        names = tuple(name for name, value in zip(self.names, values, strict=True) if value is marker)
        return tuple(None if value is marker else value for value in values), names


@dataclass(slots=True)
class _Tx:
    position: str
    commit_lsn: int
    commit_time: _dt.datetime
    skip: bool
    changes: int = 0


def _options(existing: str | None) -> str:
    """libpq `options` carrying `SESSION_SETTINGS` after whatever the DSN already asks for."""
    ours = " ".join(f"-c {name}={value.replace(' ', '')}" for name, value in pgtypes.SESSION_SETTINGS.items())
    return f"{existing} {ours}" if existing else ours


def _quoted_name(name: str) -> str:
    """`name` as one double-quoted identifier for pgoutput's `publication_names` list."""
    return '"' + name.replace('"', '""') + '"'


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PostgresSubscriber:
    """One table of a PostgreSQL database as an ordered event stream (see the module docstring).

    `events()` opens two connections: a query connection (catalog, publication, the initial copy)
    and a walsender connection (slot, stream). `acknowledge()` may be called from another thread.
    Calling `events()` again closes the previous connections and starts over.
    """

    ordering = "lsn"

    def __init__(self, dsn: str, *, table: str, slot: str, publication: str, schema: str = "public",
                 create_slot: bool = True, recreate_slot_on_loss: bool = False,
                 status_interval: float = 10.0, batch_size: int = 5000,
                 unchanged_toast: str = "fill", key_fields: Sequence[str] = (), progress: bool = False,
                 batched_copy: bool = False, copy_block_bytes: int = COPY_BLOCK_BYTES) -> None:
        self.name = f"{schema}.{table}"
        if not _SLOT_NAME.match(slot):
            raise SourceConfigError(self.name, f"invalid replication slot name {slot!r}: use 1-63 "
                                    "lower-case letters, digits and underscores")
        if status_interval < 1.0:
            raise SourceConfigError(self.name, "status_interval must be at least 1 second")
        if batch_size < 1:
            raise SourceConfigError(self.name, "batch_size must be positive")
        if copy_block_bytes < 1:
            raise SourceConfigError(self.name, "copy_block_bytes must be positive")
        if unchanged_toast not in UNCHANGED_TOAST_POLICIES:
            raise SourceConfigError(self.name, f"unknown unchanged_toast policy {unchanged_toast!r}")
        self.dsn = dsn
        self.schema = schema
        self.table = table
        self.slot = slot
        self.publication = publication
        self.create_slot = create_slot
        self.recreate_slot_on_loss = recreate_slot_on_loss
        self.status_interval = status_interval
        self.batch_size = batch_size
        self.unchanged_toast = unchanged_toast
        self.key_fields = tuple(key_fields)  # configured; () takes the table's key
        self.progress = progress  # idle progress from keepalives (module doc)
        self.batched_copy = batched_copy  # the copy as SnapshotBatch events (module doc)
        self.copy_block_bytes = copy_block_bytes
        self._sent_seen = 0  # the walsender's sent position when the stream last went idle
        self._query: Connection = None
        self._repl: Connection = None
        self._exporter: Connection = None  # the re-sync's temporary slot lives as long as this connection
        self._cursor: Any = None  # the replication cursor, once streaming
        self._lock = threading.Lock()
        self._acked = 0
        self._ack_limit = 0
        self._doing = "starting"
        self._converters = pgtypes.Converters(self._describe_type)
        self._resume_schema: TableSchema | None = None

    def resume_schema(self, schema: TableSchema | None) -> None:
        """The schema of the rows the caller holds at the next `events(start)` (see the module doc)."""
        self._resume_schema = schema

    # --- the Subscriber protocol -------------------------------------------------------------

    def events(self, start: str | None) -> Iterator[Event]:
        """Initial load (start=None) or resume after `start`, then the change stream, forever."""
        self.close()
        resume_after = None if start is None else self._parse_position(start)
        with self._lock:  # acknowledgements belong to one run: the caller restates its durable start
            self._acked = self._ack_limit = 0
        try:
            yield from self._run(resume_after)
        except psycopg2.Error as exc:
            raise self._source_error(exc) from exc
        except pgoutput.PgOutputError as exc:
            raise ProtocolError(self.name, f"{self._doing}: {exc}") from exc
        except OSError as exc:
            raise SourceUnavailable(self.name, f"{self._doing}: {exc}") from exc

    def acknowledge(self, position: str) -> None:
        """Confirm flush up to `position` to the slot: the caller holds everything up to it durably."""
        lsn = self._parse_position(position)
        with self._lock:
            if lsn > self._ack_limit:
                raise ValueError(f"{self.name}: cannot acknowledge {position}: beyond the last position "
                                 f"this source delivered ({format_lsn(self._ack_limit)})")
            if lsn <= self._acked:
                return
            self._acked = lsn
            if self._cursor is not None:
                self._send_feedback()

    def close(self) -> None:
        """Close every connection (a walsender releases its slot when its connection ends, and a
        temporary slot is dropped)."""
        with self._lock:
            self._cursor = None
            for conn in (self._repl, self._query, self._exporter):
                if conn is not None and not conn.closed:
                    with contextlib.suppress(psycopg2.Error):
                        conn.close()
            self._repl = self._query = self._exporter = None

    # --- orchestration -----------------------------------------------------------------------

    def _run(self, resume_after: int | None) -> Iterator[Event]:
        self._doing = "connecting"
        self._query = self._connect()
        self._query.autocommit = True
        self._doing = "inspecting the table"
        info = self._inspect()
        self._ensure_publication(info)
        self._doing = "opening the replication connection"
        self._repl = self._connect(psycopg2.extras.LogicalReplicationConnection)
        shape: _Shape | None = self._catalog_shape(info)
        held = self._schema(info.columns, info.key)
        if resume_after is None:
            resume_after = yield from self._initial_load(info, "initial load")
        elif not self._slot_usable():
            resume_after = yield from self._initial_load(info, "replication slot lost")
        else:
            if self._resume_schema is not None and self._resume_schema.table == self.name:
                held, shape = self._resume_schema, None  # the stream's first Relation tells the shape
            yield SchemaEvent(held)
            with self._lock:
                self._ack_limit = max(self._ack_limit, resume_after)
        while True:
            try:
                yield from self._stream(shape, held, resume_after)
            except _ShapeChanged:
                self._stop_streaming()
                resume_after, info = yield from self._resync(SCHEMA_CHANGE)
                shape, held = self._catalog_shape(info), self._schema(info.columns, info.key)
                self._doing = "opening the replication connection"
                self._repl = self._connect(psycopg2.extras.LogicalReplicationConnection)

    def _initial_load(self, info: _TableInfo, reason: str) -> Generator[Event, None, int]:
        """Create the slot, copy the table in its exported snapshot; returns the copy's position."""
        if not self.create_slot:
            raise SourceConfigError(self.name, f"{reason} needs a new replication slot {self.slot!r} "
                                    "(with an exported snapshot), but create_slot is false")
        self._drop_slot_if_present()
        self._doing = "creating the replication slot"
        consistent_point, snapshot_name = self._create_slot(self._repl, self.slot)
        self._doing = "copying the table"
        self._enter_snapshot(snapshot_name)  # before the first yield: the copy starts now
        yield SchemaEvent(self._schema(info.columns, info.key))
        yield ResyncBegin(reason)
        return (yield from self._copy_out(info, consistent_point))

    def _resync(self, reason: str) -> Generator[Event, None, tuple[int, _TableInfo]]:
        """Copy the table again while its slot stays; returns the copy's position and the table then.

        The snapshot comes from a TEMPORARY slot on a connection of its own (the server drops it
        when that connection ends, however it ends), and the table is inspected inside that
        snapshot, so shape and rows are of one moment. The table's own slot keeps its confirmed
        position until the buffer acknowledges the copy (see the module doc).
        """
        yield ResyncBegin(reason)
        self._doing = "creating a temporary replication slot for the re-sync"
        self._exporter = exporter = self._connect(psycopg2.extras.LogicalReplicationConnection)
        try:
            consistent_point, snapshot_name = self._create_slot(exporter, self._resync_slot(), temporary=True)
            self._doing = "copying the table"
            self._enter_snapshot(snapshot_name)
            info = self._inspect()
            self._check_publication_covers(info)
            yield SchemaEvent(self._schema(info.columns, info.key))
            position = yield from self._copy_out(info, consistent_point)
        finally:
            self._exporter = None
            with contextlib.suppress(psycopg2.Error):
                exporter.close()
        return position, info

    def _resync_slot(self) -> str:
        """A name no other session uses: a slot left by a killed process may not be gone yet."""
        return f"{self.slot[:48]}_resync_{os.getpid()}"

    def _copy_out(self, info: _TableInfo, consistent_point: int) -> Generator[Event, None, int]:
        """The rows of the snapshot the query connection is in, then their position (see above)."""
        count = 0
        codec = self._catalog_shape(info).codec
        if self.batched_copy:
            for texts in self._copy_batches(info):
                yield SnapshotBatch(codec, texts)
                count += texts.num_rows
        else:
            for values in self._copy_rows(info):
                yield TextSnapshotRow(codec, values)
                count += 1
        position = consistent_point - 1
        with self._lock:
            self._ack_limit = max(self._ack_limit, position)
        yield ResyncEnd(format_lsn(position), count)
        return position

    # --- connections and catalog -------------------------------------------------------------

    def _connect(self, factory: Any = None) -> Connection:
        problem = dsn_problem(self.dsn)
        if problem is not None:
            raise SourceConfigError(self.name, f"invalid dsn: {problem}")
        params = psycopg2.extensions.parse_dsn(self.dsn)
        extra: dict[str, Any] = {"options": _options(params.get("options"))}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = 10
        if "application_name" not in params:
            extra["application_name"] = f"snapshotter {self.name}"[:63]
        dsn = psycopg2.extensions.make_dsn(self.dsn, **extra)
        return psycopg2.connect(dsn, connection_factory=factory)

    def _fetch(self, query: str | sql.Composable, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._query.cursor() as cur:
            cur.execute(query, params)
            return list(cur.fetchall()) if cur.description else []

    def _inspect(self) -> _TableInfo:
        found = self._fetch(
            "SELECT c.oid, c.relkind, c.relreplident FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (self.schema, self.table))
        if not found:
            raise UnknownTable(self.name, "no such table (or not visible to this user)")
        oid, kind, identity = found[0]
        if kind != "r":
            raise SourceConfigError(self.name, f"not an ordinary table (relkind {kind!r})")
        primary_key, key = self._keys(oid, identity)
        info = _TableInfo(oid=oid, replica_identity=identity, columns=self._columns(oid),
                          primary_key=primary_key, key=key)
        if not info.key and identity == "i":
            raise NoPrimaryKey(self.name, "REPLICA IDENTITY USING INDEX names no index (was it dropped?): "
                               "changes cannot be keyed; use DEFAULT or another index")
        if not info.key:
            raise NoPrimaryKey(self.name, "the table has no primary key: changes cannot be keyed; "
                               "add one (ALTER TABLE ... ADD PRIMARY KEY)")
        self._check_identity(info)
        self._check_key_fields(info.key, info.primary_key)
        return info

    def _keys(self, oid: int, identity: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(primary key, row key): the row key is the replica identity index under USING INDEX."""
        primary_key = self._index_columns(oid, "indisprimary")
        return primary_key, self._index_columns(oid, "indisreplident") if identity == "i" else primary_key

    def _check_key_fields(self, key: tuple[str, ...], primary_key: tuple[str, ...]) -> None:
        """Configured key fields must be the table's key, in order (see the module docstring)."""
        if self.key_fields and self.key_fields != key:
            what = "primary key" if key == primary_key else "replica identity index"
            raise KeyMismatch(self.name, self.key_fields, key, what)

    def _columns(self, oid: int) -> tuple[_CatalogColumn, ...]:
        rows = self._fetch(
            "SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
            "a.attnum, a.attstorage, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a "
            "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' "
            "ORDER BY a.attnum", (oid,))
        return tuple(_CatalogColumn(*row) for row in rows)

    def _index_columns(self, oid: int, flag: Literal["indisprimary", "indisreplident"]) -> tuple[str, ...]:
        rows = self._fetch(
            sql.SQL("SELECT a.attname FROM pg_index i "
                    "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
                    "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
                    "WHERE i.indrelid = %s AND i.{} ORDER BY k.ord").format(sql.Identifier(flag)),
            (oid,))
        return tuple(name for (name,) in rows)

    def _check_identity(self, info: _TableInfo) -> None:
        identity = info.replica_identity
        if identity == "n":
            raise SourceConfigError(self.name, "REPLICA IDENTITY NOTHING: updates and deletes cannot be "
                                    "replicated; use DEFAULT or FULL")
        toastable = [c.name for c in info.columns if c.storage in _TOASTABLE_STORAGE]
        if self.unchanged_toast == "require-full" and identity != "f" and toastable:
            raise SourceConfigError(self.name, f"columns {toastable} can be TOASTed and REPLICA IDENTITY "
                                    "is not FULL, so an UPDATE may omit their unchanged values; run "
                                    "ALTER TABLE ... REPLICA IDENTITY FULL (or use unchanged_toast = fill)")

    def _ensure_publication(self, info: _TableInfo) -> None:
        self._doing = "checking the publication"
        found = self._fetch("SELECT pubinsert AND pubupdate AND pubdelete AND pubtruncate "
                            "FROM pg_publication WHERE pubname = %s", (self.publication,))
        if not found:
            self._doing = "creating the publication"
            # DuplicateObject: created concurrently by another process; check it like any existing one.
            with contextlib.suppress(psycopg2.errors.DuplicateObject):
                self._fetch(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}.{}").format(
                    sql.Identifier(self.publication), sql.Identifier(self.schema), sql.Identifier(self.table)))
            return self._ensure_publication(info)
        if not found[0][0]:
            raise SourceConfigError(self.name, f"publication {self.publication!r} does not publish every "
                                    "action (insert, update, delete, truncate): changes would be missed")
        self._check_publication_covers(info)

    def _check_publication_covers(self, info: _TableInfo) -> None:
        members = self._fetch("SELECT to_jsonb(t) FROM pg_publication_tables t "
                              "WHERE pubname = %s AND schemaname = %s AND tablename = %s",
                              (self.publication, self.schema, self.table))
        if not members:
            raise SourceConfigError(self.name, f"publication {self.publication!r} exists but does not "
                                    "include the table; add it (ALTER PUBLICATION ... ADD TABLE)")
        member: dict[str, Any] = members[0][0]
        if member.get("rowfilter"):
            raise SourceConfigError(self.name, f"publication {self.publication!r} has a row filter: the "
                                    "stream would not match the full initial copy")
        published = member.get("attnames")
        missing = [c.name for c in info.columns if published is not None and c.name not in published]
        if missing:
            raise SourceConfigError(self.name, f"publication {self.publication!r} leaves out columns {missing}")

    def _describe_type(self, oid: int) -> pgtypes.PgType | None:
        rows = self._fetch(pgtypes.PG_TYPE_QUERY, (oid,))
        return pgtypes.pg_type_of(oid, rows[0] if rows else None)

    def _schema(self, columns: Sequence[_CatalogColumn], key: Sequence[str]) -> TableSchema:
        ordinal = {name: i for i, name in enumerate(key, start=1)}
        return TableSchema(table=self.name, columns=tuple(
            Column(name=c.name, type=c.type_name, nullable=not c.not_null, primary_key=c.name in ordinal,
                   ordinal=c.attnum, primary_key_ordinal=ordinal.get(c.name, 0), default=c.default,
                   max_length=_max_length(c.type_oid, c.type_modifier), type_oid=c.type_oid)
            for c in columns))

    def _catalog_shape(self, info: _TableInfo) -> _Shape:
        return _Shape([(c.name, c.type_oid, c.type_modifier) for c in info.columns], info.key,
                      self._converters)

    # --- slot --------------------------------------------------------------------------------

    def _slot_info(self) -> _SlotInfo | None:
        rows = self._fetch("SELECT s.plugin, d.datname, s.wal_status FROM pg_replication_slots s "
                           "LEFT JOIN pg_database d ON d.oid = s.datoid WHERE s.slot_name = %s", (self.slot,))
        return _SlotInfo(*rows[0]) if rows else None

    def _slot_usable(self) -> bool:
        """Whether the slot can resume; False (lost) only when re-creating it is configured."""
        self._doing = "checking the replication slot"
        slot = self._slot_info()
        if slot is not None and slot.wal_status != "lost":
            database = self._fetch("SELECT current_database()")[0][0]
            if slot.plugin != "pgoutput" or slot.database != database:
                raise SourceConfigError(self.name, f"replication slot {self.slot!r} is not a pgoutput slot "
                                        f"of database {database!r} (plugin {slot.plugin!r}, "
                                        f"database {slot.database!r})")
            return True
        state = "does not exist (dropped?)" if slot is None else "has lost required WAL (wal_status=lost)"
        if not self.recreate_slot_on_loss:
            raise SlotLost(self.name, f"replication slot {self.slot!r} {state}: the changes after the last "
                           "durable position are gone from the source; a full re-sync is needed "
                           "(set recreate_slot_on_loss to do it automatically)")
        return False

    def _drop_slot_if_present(self) -> None:
        self._doing = "dropping the replication slot"
        if self._slot_info() is not None:
            self._fetch("SELECT pg_drop_replication_slot(%s)", (self.slot,))

    def _create_slot(self, conn: Connection, name: str, *, temporary: bool = False) -> tuple[int, str]:
        """Create a slot with an exported snapshot; returns (consistent point, snapshot name).

        The snapshot stays importable while `conn` runs no other command.
        """
        kind = "TEMPORARY LOGICAL" if temporary else "LOGICAL"
        with conn.cursor() as cur:
            cur.execute(f"CREATE_REPLICATION_SLOT {name} {kind} pgoutput EXPORT_SNAPSHOT")
            _, consistent_point, snapshot_name, _ = cur.fetchone()
        lsn = parse_lsn(consistent_point)
        if lsn is None or not snapshot_name:
            raise ProtocolError(self.name, f"unexpected CREATE_REPLICATION_SLOT answer {consistent_point!r}")
        return lsn, snapshot_name

    # --- initial copy ------------------------------------------------------------------------

    def _enter_snapshot(self, snapshot_name: str) -> None:
        """Open a transaction of the query connection in the exported snapshot (`_copy_rows` ends it)."""
        conn = self._query
        conn.autocommit = False
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))

    @contextlib.contextmanager
    def _in_snapshot(self) -> Iterator[Connection]:
        """The query connection inside the transaction `_enter_snapshot` opened: committed when the
        block ends, rolled back when it fails (or is abandoned), back in autocommit either way."""
        conn = self._query
        try:
            yield conn
            conn.commit()
        finally:
            if not conn.closed and conn.status != psycopg2.extensions.STATUS_READY:
                conn.rollback()
            if not conn.closed:
                conn.autocommit = True

    def _select_all(self, info: _TableInfo) -> sql.Composed:
        return sql.SQL("SELECT {} FROM {}.{}").format(sql.SQL(", ").join(sql.Identifier(c.name) for c in info.columns),
                                                   sql.Identifier(self.schema), sql.Identifier(self.table))

    def _copy_rows(self, info: _TableInfo) -> Iterator[TextValues]:
        """Every row of the table as its columns' output text, in `info.columns` order."""
        with self._in_snapshot() as conn, conn.cursor(name="snapshotter_initial_copy") as cur:
            # Every column as its output text: one representation with the stream (see pgtypes).
            raw = psycopg2.extensions.new_type(tuple({c.type_oid for c in info.columns}),
                                               "SNAPSHOTTER_TEXT", lambda value, _cur: value)
            psycopg2.extensions.register_type(raw, cur)
            cur.itersize = self.batch_size
            cur.execute(self._select_all(info))
            while batch := cur.fetchmany(self.batch_size):
                yield from batch

    def _copy_batches(self, info: _TableInfo) -> Iterator[pa.RecordBatch]:
        """The table as batches of column texts (`_copy_rows` in bulk): `COPY ... TO STDOUT (FORMAT
        csv)` into a local temp file, which ends the snapshot's transaction as soon as the server
        has sent the table, then parsed by Arrow's CSV reader (`copy_text_batches`)."""
        with tempfile.TemporaryDirectory(prefix="snapshotter-copy-") as work:
            spool = os.path.join(work, "copy.csv")
            with self._in_snapshot() as conn, open(spool, "wb") as out, conn.cursor() as cur:
                cur.copy_expert(sql.SQL("COPY ({}) TO STDOUT WITH (FORMAT csv)").format(self._select_all(info)), out)
            yield from copy_text_batches(spool, len(info.columns), self.copy_block_bytes)

    # --- stream ------------------------------------------------------------------------------

    def _stream(self, shape: _Shape | None, held: TableSchema, resume_after: int) -> Iterator[Event]:
        """The change stream after `resume_after`, while its changes have the shape of `held`.

        `shape` decodes tuples until the stream's own Relation message says otherwise (None: wait
        for it). Raises `_ShapeChanged` at the first change whose shape is not `held`'s.
        """
        self._doing = "starting replication"
        cursor = self._repl.cursor()
        cursor.start_replication(
            slot_name=self.slot, slot_type=psycopg2.extras.REPLICATION_LOGICAL, start_lsn=resume_after,
            options={"proto_version": "1", "publication_names": _quoted_name(self.publication)},
            decode=False, status_interval=self.status_interval)
        with self._lock:
            self._cursor = cursor
            if self._acked:
                self._send_feedback()
        self._doing = "streaming"
        stream = _StreamDecoder(self, shape, held, resume_after)
        self._sent_seen = 0
        while True:
            payload = self._next_payload()
            if payload is None:
                yield from stream.idle(self._sent_seen)
            else:
                yield from stream.handle(pgoutput.decode(payload))

    def _next_payload(self) -> bytes | None:
        """The next XLogData payload; while idle, psycopg2 sends the periodic status feedback.

        With `progress`, None when the stream is idle and the walsender's sent position moved since
        the last time (a keepalive came): the caller may report the table complete through it.
        """
        while True:
            with self._lock:
                cursor, conn = self._cursor, self._repl
                if cursor is None:
                    raise SourceUnavailable(self.name, "the source was closed while streaming")
                message = cursor.read_message()
                sent = int(cursor.wal_end or 0) if self.progress else 0
            if message is not None:
                payload: bytes = message.payload
                return payload
            if sent > self._sent_seen:
                self._sent_seen = sent
                return None
            select.select([conn], [], [], self.status_interval)

    def _stop_streaming(self) -> None:
        """End the walsender session (its partial transaction is re-sent to a later session)."""
        with self._lock:
            self._cursor = None
            repl, self._repl = self._repl, None
        if repl is not None and not repl.closed:
            with contextlib.suppress(psycopg2.Error):
                repl.close()

    def _send_feedback(self) -> None:
        """Report the acknowledged position now (caller holds the lock)."""
        self._cursor.send_feedback(write_lsn=self._acked, flush_lsn=self._acked, apply_lsn=self._acked,
                                   force=True)

    def _delivered(self, position: int) -> None:
        with self._lock:
            self._ack_limit = max(self._ack_limit, position)

    def _delivered_to(self) -> int:
        """The furthest position delivered so far (a transaction end, a copy, an idle progress)."""
        with self._lock:
            return self._ack_limit

    def _relation_schema(self, relation: pgoutput.Relation) -> tuple[_Shape, TableSchema]:
        """The shape and schema of a relation as the stream announced it (names and types from the
        message; nullability and defaults from the catalog now, which is all there is to ask)."""
        self._doing = "reading a changed table definition"
        current = {c.name: c for c in self._columns(relation.oid)}
        primary_key, key = self._keys(relation.oid, relation.replica_identity)
        if not key:
            raise NoPrimaryKey(self.name, "the table no longer has a primary key")
        self._check_key_fields(key, primary_key)
        columns = []
        for position, col in enumerate(relation.columns, start=1):
            known = current.get(col.name)
            type_name = self._fetch("SELECT format_type(%s, %s)", (col.type_oid, col.type_modifier))[0][0]
            columns.append(_CatalogColumn(col.name, col.type_oid, col.type_modifier, type_name,
                                          known.not_null if known else False,
                                          known.attnum if known else position, "",
                                          known.default if known else None))
        shape = _Shape([(c.name, c.type_oid, c.type_modifier) for c in columns], key, self._converters)
        self._doing = "streaming"
        return shape, self._schema(columns, key)

    # --- errors ------------------------------------------------------------------------------

    def _parse_position(self, position: str) -> int:
        lsn = parse_lsn(position)
        if lsn is None:
            raise ValueError(f"{self.name}: not a PostgreSQL LSN position: {position!r}")
        return lsn

    def _source_error(self, exc: psycopg2.Error) -> SourceError:
        """Map a driver error to the source error hierarchy: what failed, why, and whether to retry."""
        cause = f"{self._doing}: {_first_line(exc)}"
        code: str = exc.pgcode or ""
        message = str(exc).lower()
        if code == "55006":
            return SlotInUse(self.name, cause)
        if code in ("55000", "42704") and "replication slot" in message:
            return SlotLost(self.name, cause)  # invalidated, or dropped since the check at start
        if code.startswith(("28", "3D", "42")) or code == "53400" or (
                not code and any(marker in message for marker in _PERMANENT_CONNECT_FAILURES)):
            return SourceConfigError(self.name, cause)
        if not code or code.startswith(("08", "57P", "53", "40")):
            return SourceUnavailable(self.name, cause)
        return SourceError(self.name, cause)


_ROW_MESSAGES: Final = frozenset({pgoutput.Insert, pgoutput.Update, pgoutput.Delete})


class _StreamDecoder:
    """Turns decoded pgoutput messages into events for one table, one message at a time."""

    def __init__(self, source: PostgresSubscriber, shape: _Shape | None, held: TableSchema,
                 resume_after: int) -> None:
        self._source = source
        # Until our first Relation: a shape no Relation matches (a table has at least one column).
        self._shape = shape if shape is not None else _Shape((), (), source._converters)
        self._held = held.shape  # the shape of the rows the caller holds
        self._unchecked: TableSchema | None = None  # a new shape, compared at its first change
        self._resume_after = resume_after
        self._ours: dict[int, bool] = {}  # relation OID → is it our table
        self._tx: _Tx | None = None

    def handle(self, message: pgoutput.Message) -> Sequence[Event]:
        """The events one message yields (usually none or one), row changes checked first."""
        if type(message) in _ROW_MESSAGES:
            row = cast(pgoutput.Insert | pgoutput.Update | pgoutput.Delete, message)
            if self._is_ours(row.relation_oid) and not self._transaction().skip:
                return (self._change(row),)
            return ()
        if isinstance(message, pgoutput.Begin):
            self._begin(message)
        elif isinstance(message, pgoutput.Commit):
            return self._commit(message)
        elif isinstance(message, pgoutput.Relation):
            return self._relation(message)
        elif isinstance(message, pgoutput.Truncate) and self._truncates_ours(message):
            return (self._event(Action.TRUNCATE),)
        # Origin, Type and logical messages carry nothing the archive needs.
        return ()

    def idle(self, sent: int) -> Sequence[Event]:
        """The stream is idle and the walsender has sent every transaction committed before `sent`:
        between transactions, a change-less `TxEnd(sent - 1)` when that is past everything delivered
        (module doc, "Idle progress")."""
        through = sent - 1
        if self._tx is not None or through <= max(self._resume_after, self._source._delivered_to()):
            return ()
        self._source._delivered(through)
        return (TxEnd(format_lsn(through)),)

    def _truncates_ours(self, truncate: pgoutput.Truncate) -> bool:
        return any(self._is_ours(oid) for oid in truncate.relation_oids) and not self._transaction().skip

    def _begin(self, begin: pgoutput.Begin) -> None:
        if self._tx is not None:
            raise pgoutput.PgOutputError("Begin inside an open transaction")
        self._tx = _Tx(position=format_lsn(begin.final_lsn), commit_lsn=begin.final_lsn,
                       commit_time=begin.commit_time, skip=begin.final_lsn <= self._resume_after)

    def _commit(self, commit: pgoutput.Commit) -> Sequence[Event]:
        tx = self._transaction()
        if commit.commit_lsn != tx.commit_lsn:
            raise pgoutput.PgOutputError(f"Commit at {format_lsn(commit.commit_lsn)} closes the "
                                         f"transaction begun for {tx.position}")
        self._tx = None
        if not tx.changes:
            return ()
        self._source._delivered(tx.commit_lsn)
        return (TxEnd(tx.position),)

    def _transaction(self) -> _Tx:
        if self._tx is None:
            raise pgoutput.PgOutputError("change outside a transaction")
        return self._tx

    def _is_ours(self, oid: int) -> bool:
        ours = self._ours.get(oid)
        if ours is None:
            raise pgoutput.PgOutputError(f"change for relation {oid} before its Relation message")
        return ours

    def _relation(self, relation: pgoutput.Relation) -> Sequence[Event]:
        source = self._source
        ours = (relation.namespace, relation.name) == (source.schema, source.table)
        self._ours[relation.oid] = ours
        signature = tuple((c.name, c.type_oid, c.type_modifier) for c in relation.columns)
        if ours and signature != self._shape.signature:
            self._shape, self._unchecked = source._relation_schema(relation)
        return ()

    def _check_shape(self, schema: TableSchema) -> None:
        """The first change of a new shape: the same as the rows held (a no-op DDL, or a shape the
        stream had before the resume position), or a schema change that needs a re-sync."""
        if schema.shape != self._held:
            raise _ShapeChanged(schema.table)
        self._unchecked = None

    def _event(self, action: Action, *, old_text: TextValues | None = None, new_text: TextValues | None = None,
               old_absent: tuple[str, ...] = (), unchanged: tuple[str, ...] = ()) -> ChangeEvent:
        tx = self._transaction()
        if self._unchecked is not None:
            self._check_shape(self._unchecked)
        tx.changes += 1
        return TextChange(tx.position, action, self._shape.codec, old_text=old_text, new_text=new_text,
                          old_absent=old_absent, commit_time=tx.commit_time, unchanged=unchanged)

    def _change(self, message: pgoutput.Insert | pgoutput.Update | pgoutput.Delete) -> ChangeEvent:
        """The change as column text (`TextChange`): typing and encoding happen in the build."""
        shape = self._shape
        if isinstance(message, pgoutput.Delete):
            old, old_absent = self._old_texts(message.old_kind, message.old)
            return self._event(Action.DELETE, old_text=old, old_absent=old_absent)
        new, unchanged = shape.texts(message.new)
        if isinstance(message, pgoutput.Insert):
            if unchanged:
                raise pgoutput.PgOutputError("INSERT with unchanged-TOAST columns")
            return self._event(Action.INSERT, new_text=new)
        old, old_absent = self._old_texts(message.old_kind, message.old)
        if unchanged and message.old_kind == "O" and old is not None:
            # REPLICA IDENTITY FULL: the old row holds what the new one did not resend.
            lacking = set(old_absent)
            filled = dict(zip(shape.names, new, strict=True))
            filled.update({name: old[i] for i, name in enumerate(shape.names)
                           if name in unchanged and name not in lacking})
            new = tuple(filled[name] for name in shape.names)
            unchanged = tuple(name for name in unchanged if name in lacking)
        if unchanged:
            self._check_toast_policy(unchanged)
        return self._event(Action.UPDATE, old_text=old, old_absent=old_absent, new_text=new, unchanged=unchanged)

    def _old_texts(self, kind: pgoutput.OldKind | None,
                   values: pgoutput.TupleData | None) -> tuple[TextValues | None, tuple[str, ...]]:
        """The old image: the key only ('K', its key columns' texts), the whole row ('O'), or None."""
        if values is None:
            return None, ()
        texts, absent = self._shape.texts(values)
        if kind == "K":
            return self._shape.codec.key_texts(texts), ()  # an unsent key column reads as NULL
        return texts, absent

    def _check_toast_policy(self, unchanged: tuple[str, ...]) -> None:
        if self._source.unchanged_toast == "require-full":
            raise SourceConfigError(self._source.name, f"an UPDATE at {self._transaction().position} "
                                    f"omitted unchanged TOASTed columns {list(unchanged)} and REPLICA "
                                    "IDENTITY is not FULL (was it changed after start?)")

