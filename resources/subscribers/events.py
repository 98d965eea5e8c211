"""What every source yields: one ordered stream of schema, snapshot, change and boundary events.

Every subscriber (laredo fan-out over Connect or gRPC, PostgreSQL logical replication, the
generator) produces the same events, so the change buffer, the tests and the pipeline never care
which source they face. The stream is ordered; positions never go backwards; a diff boundary may
only fall on a `TxEnd`, which always carries a real (non-empty) position.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from snapshot_assets.archive.changes import Action, Row

if TYPE_CHECKING:
    import pyarrow as pa

    from resources.subscribers.text_rows import RowCodec, TextSnapshotRow


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the source table (laredo's ColumnDefinition / the manifest's `columns`).

    `default` is the SQL default expression (None: none), `max_length` the declared length of a
    variable-length type (0: unlimited), `type_oid` the source's type OID (0: unknown, as from
    sources without one), exactly laredo's DefaultValue, MaxLength and TypeOID.
    """

    name: str
    type: str
    nullable: bool = True
    primary_key: bool = False
    ordinal: int = 0
    primary_key_ordinal: int = 0
    default: str | None = None
    max_length: int = 0
    type_oid: int = 0

    def definition(self) -> dict[str, Any]:
        """laredo's ColumnDefinition as its manifest writes it (Go field names, no JSON tags)."""
        return {"Name": self.name, "Type": self.type, "Nullable": self.nullable, "PrimaryKey": self.primary_key,
                "OrdinalPosition": self.ordinal, "PrimaryKeyOrdinal": self.primary_key_ordinal,
                "DefaultValue": self.default, "MaxLength": self.max_length, "TypeOID": self.type_oid}


@dataclass(frozen=True, slots=True)
class TableSchema:
    """The table's identity and shape; `key_fields` in primary-key order."""

    table: str
    columns: tuple[Column, ...]

    @property
    def key_fields(self) -> tuple[str, ...]:
        pk = sorted((c for c in self.columns if c.primary_key), key=lambda c: (c.primary_key_ordinal, c.ordinal))
        return tuple(c.name for c in pk)

    @property
    def shape(self) -> tuple[tuple[str, int, str], ...]:
        """What a row of the table looks like: column names and types in order (not defaults or
        nullability, which change no stored value). Two schemas with different shapes cannot share
        rows: a row of one is not a row of the other without the source's own conversion."""
        return tuple((c.name, c.type_oid, c.type) for c in self.columns)


@dataclass(frozen=True, slots=True)
class SchemaEvent:
    """The table's schema, first in every stream and again whenever it changes."""

    schema: TableSchema


@dataclass(frozen=True, slots=True)
class ResyncBegin:
    """A full snapshot of the table follows: everything held so far is superseded.

    Emitted for the initial load and whenever a source falls back to a full snapshot after a
    resume (laredo FULL_SNAPSHOT, a re-created replication slot). The buffer records a re-sync
    marker so the next artifact is a snapshot — never silent drift.
    """

    reason: str


SCHEMA_CHANGE = "schema change"
"""The `ResyncBegin` reason of a re-sync forced by a change of the table's shape (ALTER TABLE): the
pipeline names the snapshot that follows it `schema_change` instead of `resync`."""


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    row: Row


@dataclass(frozen=True, slots=True)
class SnapshotBatch:
    """Many rows of a re-sync at once, as column text: `texts` has one string column per table
    column in `codec.names` order (null: SQL NULL), `codec` types them (`text_rows.RowCodec`).

    Why: a copy has as many rows as the table, and an event per row cost the ingest about 14 µs a
    row in Python. A source emits batches only when its consumer asks for them (the ingest's
    buffer: `PostgresSubscriber(batched_copy=True)`), so every other consumer still sees one
    `SnapshotRow` per row; `rows()` gives a batch's rows as those events.
    """

    codec: RowCodec
    texts: pa.RecordBatch

    def rows(self) -> Iterator[TextSnapshotRow]:
        from resources.subscribers.text_rows import TextSnapshotRow

        for texts in zip(*(column.to_pylist() for column in self.texts.columns), strict=True):
            yield TextSnapshotRow(self.codec, texts)


@dataclass(frozen=True, slots=True)
class ResyncEnd:
    """The snapshot is complete and consistent as of `position`; changes after it follow."""

    position: str
    row_count: int


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One row change with its own source position (its transaction's commit position)."""

    position: str
    action: Action
    old: Row | None = None
    new: Row | None = None
    commit_time: _dt.datetime | None = None
    sequence: int = 0  # the source's own ordinal (laredo journal sequence), 0 when it has none
    # Columns of an UPDATE's `new` that the source did not resend because they kept their value
    # (PostgreSQL's unchanged TOASTed values under REPLICA IDENTITY DEFAULT). `new` lacks them; the
    # archive fills them from the row's previous image (snapshot_assets/spark/images.py).
    unchanged: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TxEnd:
    """End of a source transaction at `position`: the only place a diff boundary may fall."""

    position: str
    extra: dict[str, str] = field(default_factory=dict)


Event = SchemaEvent | ResyncBegin | SnapshotRow | SnapshotBatch | ResyncEnd | ChangeEvent | TxEnd


class Subscriber(Protocol):
    """A source of events for one table.

    `events(start)` starts from a durable position (None: from nothing, which means an initial
    full load). `acknowledge(p)` tells the source that everything up to `p` is durable in the
    buffer, so it may release it (PostgreSQL: confirm flush to the slot). `ordering` names the
    comparator positions sort by (`lsn`, `sequence`).
    """

    ordering: str

    def events(self, start: str | None) -> Iterator[Event]: ...

    def acknowledge(self, position: str) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class ResumesWithSchema(Protocol):
    """A source whose stream does not say which shape the rows before the resume position had.

    PostgreSQL announces a table's shape lazily (a Relation message before the first change after
    a resume), so after `ALTER TABLE` and a restart it cannot tell by itself whether the buffer
    already holds rows of the new shape. The ingest loop tells it, before each `events(start)`,
    the schema of what the buffer holds at `start` (None: unknown); a source then re-syncs the
    table instead of mixing shapes.
    """

    def resume_schema(self, schema: TableSchema | None) -> None: ...
