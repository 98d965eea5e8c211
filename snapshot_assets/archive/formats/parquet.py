"""This project's `parquet` format (extension `.parquet`): typed columns that Spark, DuckDB and pandas
query directly, and that this project reads back with the original Python values.

Snapshot layout: one top-level column per row column. Diff layout: `action` (string), `key`
(string), `old` and `new` (nullable structs whose fields are the row columns; both structs share
one type). Column types follow the values written (nulls ignored):

- bool -> bool; int, all within int64 -> int64; float -> float64; str -> string; bytes -> binary;
- datetime -> timestamp[us, UTC] (naive values are taken as UTC, values come back aware, in UTC);
- date -> date32; only nulls -> null;
- Decimal -> string holding the exact decimal text, field metadata
  `{"snapshotter.encoding": "decimal"}` (comes back as the same Decimal);
- anything else (dict/list values, ints beyond int64, a mix of the kinds above in one column) ->
  string holding Go-JSON text (`gojson`), field metadata `{"snapshotter.encoding": "json"}`.

So ints beyond int64 and mixed columns round-trip exactly through JSON text (integers of any size
stay exact), at the cost of the JSON type mappings for those columns only (an integral float comes
back as an int, nested bytes/datetimes as their strings), exactly as in the jsonl format.

A row that lacks a column (as opposed to holding null) is recorded in a list<string> column
`__snapshotter_absent__` (metadata `{"snapshotter.encoding": "absent"}`), added only when some row
lacks a column, so `{"id": 1}` and `{"id": 2, "note": None}` both come back as written.

Why the writer spools: a parquet file has one schema, fixed before the first row group, but the
type of a column is only known once every row has been seen (a nullable column can be null for
the first million rows; a column can turn out to mix ints and floats). Rather than guess from a
first batch and then fail, or silently change values, the writer records each row (pickled, one
at a time) in a temporary file that stays in memory up to 32 MiB and then moves to disk, learns
the column types on the way, and writes the parquet file on `close()` from the spool in batches of
8192 rows (row groups of 65536). Memory stays bounded by one batch; no value is ever re-typed.
Values nested in dicts/lists are checked when they are encoded, during `close()`.

Files written by Spark's own writer (`snapshot_assets.spark.parquet_artifact`, one file per
artifact, typed from the table's schema: `archive.row_schema`) carry no Arrow schema; Spark keeps the
same `snapshotter.encoding` field metadata (also inside the diff's structs) in its own footer entry
(`org.apache.spark.sql.parquet.row.metadata`), which the reader lays over the Arrow schema. They add
one encoding, `number` (a double column: integral values read back as ints, NaN/+-Infinity as
their names, as the Go-JSON text they were written from decodes), and always carry the absent
column. So both writers' files read back to the same Python values.

Reading needs a seekable source (parquet's footer is at the end): a non-seekable stream, or one
not positioned at its start, is first copied to a spooled temporary file. Row groups are read
batch by batch.
"""

from __future__ import annotations

import datetime as _dt
import enum
import json
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import IO, Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from snapshot_assets.archive import gojson, row_schema
from snapshot_assets.archive.changes import Change, Row, as_row
from snapshot_assets.archive.errors import CorruptArtifact, EncodeError
from snapshot_assets.archive.gojson import Kind, UnsupportedValue
from snapshot_assets.archive.keys import row_key, written_key

BATCH_ROWS = 8192
ROW_GROUP_ROWS = 65536
SPOOL_MEMORY_BYTES = 32 * 1024 * 1024

ENCODING_KEY = row_schema.ENCODING_KEY.encode()
ARTIFACT_KEY = b"snapshotter.artifact"
ABSENT_COLUMN = row_schema.ABSENT_COLUMN
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# --- column types ------------------------------------------------------------------------------


class _Col(enum.Enum):
    """The storage of one column, chosen from the kinds of the values written to it."""

    NULL = "null"
    BOOL = "bool"
    INT64 = "int64"
    FLOAT64 = "float64"
    STRING = "string"
    BINARY = "binary"
    TIMESTAMP = "timestamp"
    DATE = "date"
    DECIMAL = "decimal"
    JSON = "json"


_COL_OF_KIND = {
    Kind.NULL: _Col.NULL,
    Kind.BOOL: _Col.BOOL,
    Kind.INT: _Col.INT64,
    Kind.FLOAT: _Col.FLOAT64,
    Kind.STRING: _Col.STRING,
    Kind.BYTES: _Col.BINARY,
    Kind.DATETIME: _Col.TIMESTAMP,
    Kind.DATE: _Col.DATE,
    Kind.DECIMAL: _Col.DECIMAL,
    Kind.OBJECT: _Col.JSON,
    Kind.ARRAY: _Col.JSON,
}


def _col_of(value: Any) -> _Col:
    col = _COL_OF_KIND[gojson.kind_of(value)]
    if col is _Col.INT64 and not _INT64_MIN <= value <= _INT64_MAX:
        return _Col.JSON
    return col


def _merge(a: _Col, b: _Col) -> _Col:
    """The storage that holds both: nulls fit anything, two different kinds only fit JSON text."""
    if a is b or b is _Col.NULL:
        return a
    if a is _Col.NULL:
        return b
    return _Col.JSON


def _string_array(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values, pa.string())
    except UnicodeEncodeError:  # lone surrogates; Arrow strings are UTF-8
        return pa.array([None if v is None else gojson.valid_text(v) for v in values], pa.string())


def _utc(value: _dt.datetime) -> _dt.datetime:
    """An aware datetime as UTC, done here because Arrow drops sub-second parts of UTC offsets."""
    if value.tzinfo is None:
        return value  # naive: Arrow stores the wall time as UTC, which is the documented meaning
    try:
        return value.astimezone(_dt.UTC)
    except OverflowError:
        raise UnsupportedValue(f"datetime {value.isoformat()} is outside the years 1-9999 in UTC") from None


@dataclass(frozen=True)
class _Storage:
    type: pa.DataType
    encoding: bytes | None = None  # field metadata telling the reader how to decode the cells
    cell: Callable[[Any], Any] | None = None  # per-value conversion before Arrow sees it


_STORAGE = {
    _Col.NULL: _Storage(pa.null()),
    _Col.BOOL: _Storage(pa.bool_()),
    _Col.INT64: _Storage(pa.int64()),
    _Col.FLOAT64: _Storage(pa.float64()),
    _Col.STRING: _Storage(pa.string()),
    _Col.BINARY: _Storage(pa.binary()),
    _Col.TIMESTAMP: _Storage(pa.timestamp("us", tz="UTC"), cell=_utc),
    _Col.DATE: _Storage(pa.date32()),
    _Col.DECIMAL: _Storage(pa.string(), row_schema.ENCODING_DECIMAL.encode(), gojson.decimal_text),
    _Col.JSON: _Storage(pa.string(), row_schema.ENCODING_JSON.encode(), gojson.encode_value),
}


def _field(name: str, col: _Col) -> pa.Field:
    storage = _STORAGE[col]
    metadata = None if storage.encoding is None else {ENCODING_KEY: storage.encoding}
    return pa.field(gojson.valid_text(name), storage.type, metadata=metadata)


def _column_array(name: str, col: _Col, values: list[Any], locate: Callable[[int], str]) -> pa.Array:
    """Arrow array of one column; `locate(i)` names row i when a nested value cannot be encoded."""
    storage = _STORAGE[col]
    if storage.cell is not None:
        cells: list[Any] = []
        index = 0
        try:
            for index in range(len(values)):
                value = values[index]
                cells.append(None if value is None else storage.cell(value))
        except UnsupportedValue as exc:
            raise exc.in_row(name, locate(index)) from None
        values = cells
    if storage.type == pa.string():
        return _string_array(values)
    return pa.array(values, storage.type)


# --- the plan: columns learnt while rows stream past --------------------------------------------


class _Plan:
    """The columns of the rows (or images) written so far, their storage, and whether any row
    lacks a column. Fixed when the spool is replayed."""

    def __init__(self) -> None:
        self._cols: dict[str, _Col] = {}
        self._present: dict[str, int] = {}
        self._images = 0

    def observe(self, row: Mapping[str, Any], row_key: Callable[[], str]) -> None:
        """Learn from one row; refuses (naming column and row) what no column can store, and then
        learns nothing from it, so a caller may skip the row and carry on."""
        seen: list[tuple[str, _Col]] = []
        column = ""
        try:
            for column, value in gojson.object_items(row):
                if column == ABSENT_COLUMN:
                    raise UnsupportedValue(f"column name {ABSENT_COLUMN!r} is reserved by the parquet format")
                seen.append((column, _col_of(value)))
        except UnsupportedValue as exc:
            raise exc.in_row(str(column), row_key()) from None
        self._images += 1
        for column, col in seen:
            self._cols[column] = _merge(self._cols.get(column, _Col.NULL), col)
            self._present[column] = self._present.get(column, 0) + 1

    @property
    def empty(self) -> bool:
        return not self._cols

    @property
    def _needs_absent(self) -> bool:
        # Also with no columns at all: the absent column is then what carries the row count.
        return self._images > 0 and (self.empty or any(n < self._images for n in self._present.values()))

    def fields(self) -> list[pa.Field]:
        fields = [_field(name, col) for name, col in self._cols.items()]
        if self._needs_absent:
            fields.append(pa.field(ABSENT_COLUMN, pa.list_(pa.string()),
                                   metadata={ENCODING_KEY: row_schema.ENCODING_ABSENT.encode()}))
        return fields

    def arrays(
        self, images: Sequence[Mapping[str, Any] | None], locate: Callable[[int], str]
    ) -> list[pa.Array]:
        """One array per field of `fields()` for these rows (a None image gives nulls)."""
        arrays = [
            _column_array(name, col, [None if img is None else img.get(name) for img in images], locate)
            for name, col in self._cols.items()
        ]
        if self._needs_absent:
            arrays.append(pa.array([self._absent(img) for img in images], pa.list_(pa.string())))
        return arrays

    def _absent(self, image: Mapping[str, Any] | None) -> list[str] | None:
        if image is None:
            return None
        return [gojson.valid_text(name) for name in self._cols if name not in image] or None


# --- writing -----------------------------------------------------------------------------------


class _Spool:
    """Items pickled one by one into a temporary file (memory up to 32 MiB, then disk).

    Pickling on arrival also snapshots the row: a caller may reuse or mutate its dict after write().
    """

    def __init__(self) -> None:
        # Lives across write() calls until close(), so no `with` block can own it.
        self._file: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115
        self._count = 0

    def append(self, item: Any, images: Iterable[Row | None], row_key: Callable[[], str]) -> None:
        """Spool `item`, which holds the row `images` (used to explain a failure)."""
        try:
            data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            # Only a value nested in a dict/list can get here (top-level values were classified):
            # let the JSON encoder name its column; anything it accepts is picklable.
            for image in images:
                if image is not None:
                    gojson.encode_row(image, row_key)
            raise EncodeError(f"parquet: cannot spool the row: {exc}", row_key=row_key()) from exc
        self._file.write(data)
        self._count += 1

    def batches(self) -> Iterator[list[Any]]:
        self._file.seek(0)
        remaining = self._count
        while remaining:
            size = min(remaining, BATCH_ROWS)
            yield [pickle.load(self._file) for _ in range(size)]
            remaining -= size

    def close(self) -> None:
        self._file.close()


class _GroupWriter:
    """A ParquetWriter on `out` that gathers batches into row groups of ROW_GROUP_ROWS rows."""

    def __init__(self, out: BinaryIO, schema: pa.Schema) -> None:
        self._writer = pq.ParquetWriter(out, schema)
        self._pending: list[pa.RecordBatch] = []
        self._rows = 0

    def add(self, arrays: list[pa.Array]) -> None:
        batch = pa.RecordBatch.from_arrays(arrays, schema=self._writer.schema)
        self._pending.append(batch)
        self._rows += batch.num_rows
        if self._rows >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._writer.write_table(pa.Table.from_batches(self._pending), row_group_size=ROW_GROUP_ROWS)
        self._pending, self._rows = [], 0

    def close(self) -> None:
        self._flush()
        self._writer.close()


def _schema(fields: list[pa.Field], artifact: bytes) -> pa.Schema:
    return pa.schema(fields, metadata={ARTIFACT_KEY: artifact})


def _write_spool(out: BinaryIO, schema: pa.Schema, spool: _Spool,
                 arrays: Callable[[list[Any]], list[pa.Array]]) -> None:
    """Replay the spool into a parquet file on `out`, always releasing the spool."""
    try:
        writer = _GroupWriter(out, schema)
        for batch in spool.batches():
            converted = arrays(batch)
            del batch  # let it go before the spool decodes the next one: one batch alive, not two
            writer.add(converted)
        writer.close()
    except pa.ArrowException as exc:
        raise EncodeError(f"parquet: cannot write the artifact: {exc}") from exc
    finally:
        spool.close()


class ParquetSnapshotWriter:
    """Learns the columns while spooling rows; writes the file on close()."""

    def __init__(self, out: BinaryIO, key_fields: Sequence[str]) -> None:
        self._out = out
        self._key_fields = tuple(key_fields)
        self._plan = _Plan()
        self._spool = _Spool()

    def write(self, row: Row) -> None:
        def key() -> str:
            return row_key(row, self._key_fields)

        self._plan.observe(row, key)
        self._spool.append(row, (row,), key)

    def close(self) -> None:
        def arrays(rows: list[Row]) -> list[pa.Array]:
            return self._plan.arrays(rows, lambda i: row_key(rows[i], self._key_fields))

        _write_spool(self._out, _schema(self._plan.fields(), b"snapshot"), self._spool, arrays)


_TEXT_OF_KIND: dict[Kind, Callable[[Any], str]] = {
    Kind.STRING: lambda value: gojson.valid_text(str(value)),
    Kind.DECIMAL: gojson.decimal_text,
    Kind.BYTES: gojson.bytes_text,
    Kind.DATETIME: gojson.time_text,
    Kind.DATE: gojson.date_text,
}


def typed_value(value: Any) -> Any:
    """What a typed reader of this format holds for `value`, for diff keys: int64, float64 and bool
    columns give the exact value (2^53+1 stays `9007199254740993`, 1000000 stays `1000000`),
    strings and decimal text their text, bytes and times the text the other formats carry for them
    (base64, RFC 3339, `YYYY-MM-DD`), JSON-encoded cells their decoded value with exact integers.

    parquet is not one of laredo's formats, so no laredo reader defines its keys; typed columns are
    its point, and a reader of typed columns has no reason to round an int64 key to a double.
    """
    kind = gojson.kind_of(value)
    text = _TEXT_OF_KIND.get(kind)
    if text is not None:
        return text(value)
    if kind is Kind.OBJECT or kind is Kind.ARRAY:
        return gojson.loads(gojson.encode_value(value))
    return value


class ParquetDiffWriter:
    """Learns the row columns of every old/new image while spooling changes; writes on close().

    The `key` is laredo's RowKey (`%v`) of the image's key values as the typed columns hold them
    (`typed_value`): exact integers, never rounded to doubles.
    """

    def __init__(self, out: BinaryIO, key_fields: Sequence[str]) -> None:
        self._out = out
        self._key_fields = tuple(key_fields)
        self._plan = _Plan()
        self._spool = _Spool()

    def write(self, change: Change) -> None:
        old, new = as_row(change.old), as_row(change.new)
        text = written_key(change, self._key_fields, typed_value)

        def key() -> str:
            return text

        for image in (old, new):
            if image is not None:
                self._plan.observe(image, key)
        self._spool.append((change.action.value, text, old, new), (old, new), key)

    def _image_type(self) -> pa.DataType:
        # Parquet cannot store a struct without fields: with no row columns at all (a diff of
        # TRUNCATEs only), the images are a null column.
        return pa.null() if self._plan.empty else pa.struct(self._plan.fields())

    def _images(self, images: list[Row | None], keys: list[str]) -> pa.Array:
        if self._plan.empty:
            return pa.nulls(len(images))
        return pa.StructArray.from_arrays(
            self._plan.arrays(images, keys.__getitem__),
            fields=self._plan.fields(),
            mask=pa.array([image is None for image in images], pa.bool_()),
        )

    def close(self) -> None:
        image_type = self._image_type()
        schema = _schema([
            pa.field("action", pa.string(), nullable=False),
            pa.field("key", pa.string(), nullable=False),
            pa.field("old", image_type),
            pa.field("new", image_type),
        ], b"diff")

        def arrays(changes: list[tuple[str, str, Row | None, Row | None]]) -> list[pa.Array]:
            keys = [key for _, key, _, _ in changes]
            return [
                pa.array([action for action, _, _, _ in changes], pa.string()),
                _string_array(list(keys)),
                self._images([old for _, _, old, _ in changes], keys),
                self._images([new for _, _, _, new in changes], keys),
            ]

        _write_spool(self._out, schema, self._spool, arrays)


# --- reading -----------------------------------------------------------------------------------


@contextmanager
def _seekable(src: BinaryIO) -> Iterator[BinaryIO]:
    """`src` itself when parquet can seek in it from its start, else a spooled copy of the rest."""
    try:
        direct = src.seekable() and src.tell() == 0
    except (AttributeError, OSError):
        direct = False
    if direct:
        yield src
        return
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as copy:
        shutil.copyfileobj(src, copy)
        copy.seek(0)
        yield copy  # type: ignore[misc]  # SpooledTemporaryFile is a binary file object


def _batches(src: BinaryIO, artifact: bytes) -> Iterator[pa.RecordBatch]:
    """The record batches of a parquet artifact, any Arrow/IO failure being a CorruptArtifact."""
    with _seekable(src) as source:
        try:
            file = pq.ParquetFile(source)
            written_as = (file.schema_arrow.metadata or {}).get(ARTIFACT_KEY, artifact)
            if written_as != artifact:
                raise CorruptArtifact(f"parquet artifact holds a {written_as.decode(errors='replace')}, "
                                      f"not a {artifact.decode()}")
            footer = file.metadata.metadata or {}
            annotated = annotated_schema(file.schema_arrow, footer.get(SPARK_SCHEMA_KEY))
            for batch in file.iter_batches(batch_size=BATCH_ROWS):
                batch.validate(full=True)  # Arrow does not check text values as it reads (invalid UTF-8)
                yield batch if annotated is None else pa.RecordBatch.from_arrays(batch.columns, schema=annotated)
        except (pa.ArrowException, OSError) as exc:
            raise CorruptArtifact(f"parquet artifact cannot be read: {exc}") from None
        except UnicodeDecodeError as exc:  # Arrow decodes the footer's names as it opens the file
            raise CorruptArtifact(f"parquet artifact names a column in bytes that are not UTF-8: {exc}") from None


def annotated_schema(schema: pa.Schema, spark_schema: bytes | None) -> pa.Schema | None:
    """`schema` with the field metadata a Spark-written file keeps in its own footer entry (None
    when the file was not written by Spark)."""
    if spark_schema is None:
        return None
    try:
        fields = json.loads(spark_schema)["fields"]
        return pa.schema([_annotated_field(f, s) for f, s in zip(schema, fields, strict=True)],
                         metadata=schema.metadata)
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptArtifact(f"parquet artifact has an unreadable Spark schema: {exc!r}") from None


def _annotated_field(field: pa.Field, spark: dict[str, Any]) -> pa.Field:
    if spark["name"] != field.name:
        raise CorruptArtifact(f"parquet Spark schema names {spark['name']!r} where the file has {field.name!r}")
    inner = spark["type"]
    type_ = field.type
    if pa.types.is_struct(type_) and isinstance(inner, dict) and inner.get("type") == "struct":
        type_ = pa.struct([_annotated_field(type_.field(i), s) for i, s in enumerate(inner["fields"])])
    encoding = (spark.get("metadata") or {}).get(row_schema.ENCODING_KEY)
    annotated = field.with_type(type_)
    return annotated.with_metadata({ENCODING_KEY: encoding.encode()}) if encoding else annotated


def _decode(field: pa.Field, array: pa.Array) -> list[Any]:
    """The Python values of one column, undoing the encodings named in the field metadata."""
    values: list[Any] = array.to_pylist()
    decode = _DECODERS.get((field.metadata or {}).get(ENCODING_KEY, b""))
    if decode is None:
        return values
    try:
        return [None if v is None else decode(v) for v in values]
    except (CorruptArtifact, InvalidOperation) as exc:
        raise CorruptArtifact(f"parquet column {field.name!r} holds an undecodable cell: {exc}") from None


_DECODERS: dict[bytes, Callable[[Any], Any]] = {
    row_schema.ENCODING_JSON.encode(): gojson.loads,
    row_schema.ENCODING_DECIMAL.encode(): Decimal,
    row_schema.ENCODING_NUMBER.encode(): row_schema.number_value,
}


def _rows(fields: Sequence[pa.Field], arrays: Sequence[pa.Array], num_rows: int) -> list[Row]:
    """Rows from parallel columns, dropping the columns each row's absent list names."""
    names: list[str] = []
    columns: list[list[Any]] = []
    absent: list[list[str] | None] | None = None
    for field, array in zip(fields, arrays, strict=True):
        if (field.metadata or {}).get(ENCODING_KEY) == row_schema.ENCODING_ABSENT.encode():
            absent = array.to_pylist()
        else:
            names.append(field.name)
            columns.append(_decode(field, array))
    rows = [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)] if columns \
        else [{} for _ in range(num_rows)]
    for row, gone in zip(rows, absent or (), strict=False):
        for name in gone or ():
            row.pop(name, None)
    return rows


def _images(batch: pa.RecordBatch, name: str) -> list[Row | None]:
    """The old or new images of a diff batch (None where the struct is null or the column absent)."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        return [None] * batch.num_rows
    array = batch.column(index)
    if not pa.types.is_struct(array.type):
        return [None] * batch.num_rows  # the null column of an image-less diff
    struct_type = batch.schema.field(index).type  # the schema's type carries the fields' metadata
    fields = [struct_type.field(i) for i in range(struct_type.num_fields)]
    rows = _rows(fields, array.flatten(), batch.num_rows)
    valid = array.is_valid().to_pylist()
    return [as_row(row) if ok else None for row, ok in zip(rows, valid, strict=True)]


def _strings(batch: pa.RecordBatch, name: str) -> list[Any]:
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise CorruptArtifact(f"parquet diff has no {name!r} column")
    values: list[Any] = batch.column(index).to_pylist()
    return values


def _changes(batch: pa.RecordBatch) -> Iterator[Change]:
    actions, keys = _strings(batch, "action"), _strings(batch, "key")
    olds, news = _images(batch, "old"), _images(batch, "new")
    for action, key, old, new in zip(actions, keys, olds, news, strict=True):
        try:
            parsed = Change.parse_action(action)
        except ValueError as exc:
            raise CorruptArtifact(f"parquet diff: {exc}") from None
        if not isinstance(key, str):
            raise CorruptArtifact(f"parquet diff: key {key!r} is not a string")
        yield Change(parsed, key, old, new)


class ParquetFormat:
    """Typed parquet artifacts (format id `parquet`, extension `.parquet`)."""

    format_id = "parquet"
    extension = ".parquet"

    key_value = staticmethod(typed_value)

    def snapshot_writer(self, out: BinaryIO, key_fields: Sequence[str] = ("id",)) -> ParquetSnapshotWriter:
        return ParquetSnapshotWriter(out, key_fields)

    def diff_writer(self, out: BinaryIO, key_fields: Sequence[str] = ("id",)) -> ParquetDiffWriter:
        return ParquetDiffWriter(out, key_fields)

    def read_snapshot(self, src: BinaryIO) -> Iterator[Row]:
        for batch in _batches(src, b"snapshot"):
            yield from _rows(batch.schema, batch.columns, batch.num_rows)

    def read_diff(self, src: BinaryIO) -> Iterator[Change]:
        for batch in _batches(src, b"diff"):
            yield from _changes(batch)
