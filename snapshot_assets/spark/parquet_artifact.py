"""Parquet artifacts from a row's typed columns, as ONE file each.

Rows travel through the jobs as Go-JSON text. `typed_columns` turns that text into a struct of
typed columns (`row_schema.RowSchema`) with Spark SQL only: each row is parsed twice by the JVM's
JSON parser, once as `MAP<STRING,STRING>` (a member's raw JSON text, or a string's contents) and
once as `MAP<STRING,VARIANT>` (what kind of value a member is: string, null, bool, nested, and
whether it is there at all), and every cell is cast from its raw text. Raw text, not the variant,
carries the values, because Spark's variant turns an integer of more than 38 digits into a double.

A value that does not fit its column (a string in an INT64 column, a fraction in an integer
column, an integer a double cannot hold exactly, a member the schema does not name) is never
written as null: the struct's evaluation raises, through `raise_error`, a message that
`refusing_misfits` turns into a `SchemaMisfit` naming the column, the row key, the value and the
type. A row lacking a column (as opposed to holding null) is named in the struct's
`__snapshotter_absent__` list, exactly as the Python writer records it.

A snapshot's parquet object is made of one piece per bucket of the state (parquet_pieces.py): each
bucket task writes its rows' typed columns with Arrow's writer under `snapshot_arrow_schema` (the
image's columns, Spark's schema JSON under Spark's footer key), and the object is the buckets'
bodies with their footers merged. `write_diff` writes a diff as one parquet file with Spark's
writer (`coalesce(1)` into a temporary folder beside the target on the staging filesystem, then
the single part file is renamed to the target), so every artifact is one object, as laredo's
layout expects of every format. Spark keeps StructField metadata in the file footer
(`org.apache.spark.sql.parquet.row.metadata`), which is where the `snapshotter.encoding` facts
live; the project's reader reads them from there. The bytes are a function of the rows and their
order: neither writer puts a time or host into a parquet file. On a cluster (the build given
`Uploads`: no disk shared by the driver and the executors, and no hadoop-aws for Spark's writer to
reach S3) the one task holding every change writes the diff with Arrow's writer, Spark's schema
JSON under Spark's footer key, and sends it straight into the destinations: same rows, columns and
encodings, other bytes (another writer's pages and footer). A diff is sorted (TRUNCATE first, then
by key), so its bytes do not depend on the shuffle.

Schemaless sources: `infer_row_schema` classifies every member of every row (one aggregation in
the JVM) and merges the kinds per column with the Python writer's rule.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from resources.buffer.segments import TYPED_COLUMN
from snapshot_assets.archive import gojson
from snapshot_assets.archive.errors import EncodeError
from snapshot_assets.archive.formats.parquet import SPARK_SCHEMA_KEY, typed_value
from snapshot_assets.archive.keys import go_v
from snapshot_assets.archive.row_schema import (
    ABSENT_COLUMN,
    ENCODING_ABSENT,
    ENCODING_KEY,
    KIND_BIGINT,
    KIND_BOOL,
    KIND_FLOAT,
    KIND_INT,
    KIND_NESTED,
    KIND_NULL,
    KIND_STRING,
    ColumnType,
    RowSchema,
    column_type_of_kinds,
    number_value,
)
from snapshot_assets.spark.pieces import PieceWriter, Sent, Uploads

MISFIT_MARKER = "snapshotter.misfit:"
ROW_GROUP_BYTES = 32 * 1024 * 1024
PARQUET_FORMAT = "parquet"
"""Spark's `parquet.block.size`: row groups of at most ~32 MiB, so readers can split a large file
(Spark, Athena and DuckDB parallelise by row group) while each group stays well compressible."""

_KIND_ABSENT = "absent"
_INT_TOKEN = r"^-?[0-9]+$"
_FLOAT_NAMES = ("NaN", "Infinity", "-Infinity")

SPARK_TYPES: dict[ColumnType, DataType] = {
    ColumnType.BOOL: BooleanType(), ColumnType.INT16: ShortType(), ColumnType.INT32: IntegerType(),
    ColumnType.INT64: LongType(), ColumnType.FLOAT64: DoubleType(), ColumnType.STRING: StringType(),
    ColumnType.JSON: StringType(),
}


class SchemaMisfit(EncodeError):
    """A row value that its column's type cannot hold exactly (or a member the schema lacks)."""


def spark_field(name: str, column_type: ColumnType) -> StructField:
    encoding = column_type.encoding
    return StructField(name, SPARK_TYPES[column_type], True, {ENCODING_KEY: encoding} if encoding else {})


def image_type(schema: RowSchema) -> StructType:
    """The Spark type of one typed row image: the schema's columns, then the absent list."""
    fields = [spark_field(c.name, c.type) for c in schema.columns]
    fields.append(StructField(ABSENT_COLUMN, ArrayType(StringType(), True), True, {ENCODING_KEY: ENCODING_ABSENT}))
    return StructType(fields)


# --- reading a member of a row's text ------------------------------------------------------------------


def _kind(member: Column, raw: Column) -> Column:
    """One of the `row_schema.KIND_*` names of a member (its variant and raw text), or 'absent'."""
    return _kind_of(F.schema_of_variant(member), raw)


def _kind_of(kind: Column, raw: Column) -> Column:
    """`_kind` from the member's `schema_of_variant` (null when absent) and raw text."""
    return (F.when(kind.isNull(), F.lit(_KIND_ABSENT))
            .when(kind == "VOID", F.lit(KIND_NULL))
            .when(kind == "STRING", F.lit(KIND_STRING))
            .when(kind == "BOOLEAN", F.lit(KIND_BOOL))
            .when(kind.startswith("OBJECT") | kind.startswith("ARRAY"), F.lit(KIND_NESTED))
            .when(raw.rlike(_INT_TOKEN),
                  F.when(raw.try_cast("bigint").isNull(), F.lit(KIND_BIGINT)).otherwise(F.lit(KIND_INT)))
            .otherwise(F.lit(KIND_FLOAT)))


def _raw_map(text: Column) -> Column:
    """member -> its JSON text (a string member: its contents); null when not a JSON object."""
    return F.from_json(text, "MAP<STRING,STRING>")


def _variant_map(text: Column) -> Column:
    """member -> its value as a variant (what kind it is; JSON null is a VOID variant)."""
    return F.from_json(text, "MAP<STRING,VARIANT>")


def _exact_digits(value: Column) -> Column:
    """The exact decimal digits of an integral double below 1e21, without its sign. (Spark's double
    to decimal cast goes through Double.toString, whose digits are not exact, so go through BIGINT:
    exact below 2^63, and above it the double is a multiple of 2048, so value/1024 is exact.)"""
    magnitude = F.abs(value)
    big = (magnitude / 1024).try_cast("bigint").cast("decimal(38,0)") * F.lit(1024).cast("decimal(38,0)")
    return (F.when(magnitude < float(2**62), magnitude.try_cast("bigint").cast("string"))
            .when(magnitude < 1e21, big.cast("decimal(38,0)").cast("string")))


def _round_significant(digits: Column, n: Column) -> Column:
    """The integer written as `digits` rounded half-even to `n` significant digits, as DECIMAL(38,0)."""
    width = F.length(digits)
    cut = F.greatest(width - n, F.lit(0))
    head = digits.substr(F.lit(1), width - cut).cast("decimal(38,0)")
    tail = digits.substr(width - cut + 1, cut)
    half = F.concat(F.lit("5"), F.repeat(F.lit("0"), F.greatest(cut - 1, F.lit(0))))
    up = (cut > 0) & ((tail > half) | ((tail == half) & ((head % 2) == 1)))
    rounded = head + F.when(up, F.lit(1)).otherwise(F.lit(0))
    return F.concat(rounded.cast("string"), F.repeat(F.lit("0"), cut)).cast("decimal(38,0)")


def _reads_back_as(cell: Column, raw: Column, digits: Column) -> Column:
    """Whether a double `cell` parsed from the integer token `raw` reads back as `raw`
    (`number_value`: below 2^53 the integer itself, above it the shortest round-trip digits padded
    with zeros, which is what Go writes for a double); `digits` are `_exact_digits(cell)`. Checked
    exactly in decimal arithmetic: `raw` must be the double's digits correctly rounded to its own
    significant length, and no shorter rounding may give the same double. Java's Double.toString
    is not used: before JDK 19 it sometimes prints a digit too many."""
    magnitude = F.abs(cell)
    small = (magnitude < float(2**53)) & (cell.try_cast("bigint") == raw.try_cast("bigint"))
    wanted = F.regexp_replace(raw, "^-", "")
    significant = F.length(F.regexp_replace(wanted, "0+$", ""))
    closest = _round_significant(digits, significant) == wanted.try_cast("decimal(38,0)")
    shortest = (significant <= 1) | (_round_significant(digits, significant - 1).cast("double") != magnitude)
    large = (magnitude >= float(2**53)) & (magnitude < 1e21) & closest & shortest
    return small | large


def _cell(column_type: ColumnType, kind: Column, raw: Column, member: Column) -> Column:
    """The typed cell of one member (null where it does not fit; `_fits` says which)."""
    if column_type is ColumnType.BOOL:
        return F.when(kind == KIND_BOOL, raw == "true")
    if column_type in (ColumnType.INT16, ColumnType.INT32, ColumnType.INT64):
        return F.when(kind == KIND_INT, raw.try_cast(SPARK_TYPES[column_type]))
    if column_type is ColumnType.FLOAT64:
        named = (kind == KIND_STRING) & raw.isin(*_FLOAT_NAMES)
        return F.when(kind.isin(KIND_INT, KIND_BIGINT, KIND_FLOAT) | named, raw.try_cast("double"))
    if column_type is ColumnType.STRING:
        return F.when(kind == KIND_STRING, raw)
    return F.when(kind == KIND_STRING, F.to_json(member)).when(~kind.isin(_KIND_ABSENT, KIND_NULL), raw)


def _fits(column_type: ColumnType, kind: Column, raw: Column, cell: Column, digits: Column | None) -> Column:
    """Whether the member reads back exactly from `cell` (absent and null members always do)."""
    empty = kind.isin(_KIND_ABSENT, KIND_NULL)
    if column_type is ColumnType.BOOL:
        return empty | (kind == KIND_BOOL)
    if column_type in (ColumnType.INT16, ColumnType.INT32, ColumnType.INT64):
        return empty | cell.isNotNull()
    if column_type is ColumnType.FLOAT64:
        assert digits is not None
        named = (kind == KIND_STRING) & raw.isin(*_FLOAT_NAMES)
        fraction = (kind == KIND_FLOAT) & cell.isNotNull() & ~((F.abs(cell) < 1e21) & (cell % 1 == 0))
        integral = kind.isin(KIND_INT, KIND_BIGINT) & F.coalesce(_reads_back_as(cell, raw, digits), F.lit(False))
        return empty | named | fraction | integral
    if column_type is ColumnType.STRING:
        return empty | (kind == KIND_STRING)
    return F.lit(True)


def _ref(name: str) -> Column:
    return F.col("`" + name.replace("`", "``") + "`")


def with_image(frame: DataFrame, text: Column, schema: RowSchema, key: Column, into: str) -> DataFrame:
    """`frame` plus the struct column `into`: the typed image (`image_type(schema)`) of the Go-JSON
    `text` (null where `text` is null). Evaluating it raises (see `refusing_misfits`) when a member
    does not fit, naming `key`.

    Built as a few projections (parse, classify, cast, check, assemble) rather than one expression:
    each step refers to the previous step's columns, which keeps the plan small (one expression
    repeating the classification in every check makes Catalyst's optimizer crawl)."""
    t = f"__{into}_"
    keep = [_ref(c) for c in frame.columns if c != into]
    columns = list(enumerate(schema.columns))
    names = F.array(*[F.lit(n) for n in schema.names]) if schema.columns else F.array().cast("array<string>")
    staged = frame.select(*keep, text.alias(t + "text"), key.cast("string").alias(t + "key"),
                          _raw_map(text).alias(t + "raw"), _variant_map(text).alias(t + "var"))
    raw_map, var_map = F.col(t + "raw"), F.col(t + "var")
    staged = staged.select("*", *[x for i, c in columns for x in (
        F.try_element_at(raw_map, F.lit(c.name)).alias(f"{t}r{i}"),
        F.schema_of_variant(F.try_element_at(var_map, F.lit(c.name))).alias(f"{t}v{i}"))])
    staged = staged.select("*", *[_kind_of(F.col(f"{t}v{i}"), F.col(f"{t}r{i}")).alias(f"{t}k{i}")
                                  for i, c in columns])
    staged = staged.select("*", *[_cell(c.type, F.col(f"{t}k{i}"), F.col(f"{t}r{i}"),
                                        F.try_element_at(var_map, F.lit(c.name))).alias(f"{t}c{i}")
                                  for i, c in columns])
    staged = staged.select("*", *[_exact_digits(F.col(f"{t}c{i}")).alias(f"{t}d{i}")
                                  for i, c in columns if c.type is ColumnType.FLOAT64])
    staged = staged.select("*", *[_fits(c.type, F.col(f"{t}k{i}"), F.col(f"{t}r{i}"), F.col(f"{t}c{i}"),
                                        F.col(f"{t}d{i}") if c.type is ColumnType.FLOAT64 else None).alias(f"{t}f{i}")
                                  for i, c in columns])
    # No lambdas (higher-order functions are interpreted, row by row): count the members the
    # schema names, and only name an unknown one when there is one.
    present = sum((F.col(f"{t}k{i}") != _KIND_ABSENT).cast("int") for i, _ in columns) if columns else F.lit(0)
    unknown = F.when(F.size(raw_map) > present, F.try_element_at(F.array_except(F.map_keys(raw_map), names), F.lit(1)))
    misfit = F.coalesce(*[F.when(~F.col(f"{t}f{i}"), F.lit(c.name)) for i, c in columns], unknown)
    staged = staged.select("*", misfit.alias(t + "misfit"))
    misfit = F.col(t + "misfit")
    absent = F.array_compact(F.array(*[F.when(F.col(f"{t}k{i}") == _KIND_ABSENT, F.lit(c.name)) for i, c in columns])) \
        if columns else F.array().cast("array<string>")
    types = F.create_map(*[x for c in schema.columns for x in (F.lit(c.name), F.lit(c.type.value))]) \
        if schema.columns else F.create_map().cast("map<string,string>")
    report = F.to_json(F.struct(
        F.when(raw_map.isNotNull(), misfit).alias("column"), F.col(t + "key").alias("key"),
        F.coalesce(F.try_element_at(types, misfit), F.lit("no such column")).alias("type"),
        F.substring(F.coalesce(F.try_element_at(raw_map, misfit), F.col(t + "text")), 1, 200).alias("value")))
    guarded = (F.when(raw_map.isNull() | misfit.isNotNull(), F.raise_error(F.concat(F.lit(MISFIT_MARKER), report)))
               .otherwise(F.when(F.size(absent) > 0, absent)))
    image = F.struct(*[F.col(f"{t}c{i}").alias(c.name) for i, c in columns], guarded.alias(ABSENT_COLUMN))
    return staged.select(*keep, F.when(F.col(t + "text").isNotNull(), image.cast(image_type(schema))).alias(into))


def typed_columns(frame: DataFrame, schema: RowSchema, *, text: str = "row", key: str = "key",
                  into: str = TYPED_COLUMN, given: str | None = None) -> DataFrame:
    """`frame` with the typed image of its Go-JSON column `text` added as the struct column `into`
    (the schema's columns and `__snapshotter_absent__`). Any action over it raises, through
    `refusing_misfits`, a `SchemaMisfit` for a value that does not fit, naming the `key` column's value.

    With `given` (a column of `frame` holding typed images already, e.g. `typed_copies`'), a row
    whose `given` is not null keeps it and is not parsed here (its text is not read)."""
    if given is None:
        return with_image(frame, _ref(text), schema, _ref(key), into)
    missing = F.when(_ref(given).isNull(), _ref(text))
    scratch = "__typed_" + into
    typed = with_image(frame, missing, schema, _ref(key), scratch)
    return typed.withColumn(into, F.coalesce(_ref(given), _ref(scratch))) \
        .drop(*{scratch, given} - {into})


@contextmanager
def refusing_misfits() -> Iterator[None]:
    """Turn the Spark failure a misfit raised inside a job into a SchemaMisfit (other errors pass)."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        at = text.find(MISFIT_MARKER)
        if at < 0:
            raise
        try:
            report, _ = json.JSONDecoder().raw_decode(text, at + len(MISFIT_MARKER))
        except ValueError:
            raise SchemaMisfit(f"a row value does not fit its parquet column: {text[at:at + 400]}") from exc
        column = report.get("column")
        if column is None:
            problem = f"parquet: the row is not a JSON object: {report.get('value')!r}"
        elif report.get("type") == "no such column":
            problem = "parquet: the row has a column the table schema does not name"
        else:
            problem = (f"parquet: value {report.get('value')} does not fit the column's type "
                       f"{report.get('type')} (it would not read back exactly)")
        raise SchemaMisfit(problem, column=column, row_key=report.get("key")) from None


# --- inference -------------------------------------------------------------------------------------------


def infer_row_schema(frame: DataFrame, texts: Sequence[str] = ("row",)) -> RowSchema:
    """The schema of the Go-JSON rows in the columns `texts` (nulls skipped): one aggregation in
    the JVM collecting each member's kinds; columns in name order (the order Go-JSON writes them)."""
    if not texts:
        raise ValueError("infer_row_schema needs at least one text column")
    text = F.explode(F.array(*[_ref(t) for t in texts])) if len(texts) > 1 else _ref(texts[0])
    rows = frame.select(text.alias("t")).where("t IS NOT NULL")
    parsed = rows.select(_raw_map(F.col("t")).alias("raw"), _variant_map(F.col("t")).alias("var"))
    members = parsed.select(F.explode(F.map_keys("var")).alias("name"), "raw", "var")
    kind = _kind(F.try_element_at(F.col("var"), F.col("name")), F.try_element_at(F.col("raw"), F.col("name")))
    kinds = members.select("name", kind.alias("kind")).groupBy("name").agg(F.collect_set("kind").alias("kinds"))
    return RowSchema.of((r["name"], column_type_of_kinds(r["kinds"])) for r in sorted(kinds.collect()))


# --- writing one file -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WrittenParquet:
    """The one parquet file of an artifact: staged at `path`, or sent into the uploads (`Sent`)."""

    path: Path | Sent
    bytes: int
    rows: int


def check_names(spark: SparkSession, names: Sequence[str]) -> None:
    """Spark refuses to write (and to read) two columns whose names differ only in case unless the
    session is case sensitive; say so instead of failing with Spark's message."""
    if spark.conf.get("spark.sql.caseSensitive", "false") == "true":
        return
    folded: dict[str, str] = {}
    for name in names:
        other = folded.setdefault(name.lower(), name)
        if other != name:
            raise EncodeError(f"parquet: columns {other!r} and {name!r} differ only in case; the Spark writer "
                              "needs spark.sql.caseSensitive=true for this table", column=name)


def write_parquet_file(frame: DataFrame, out_path: Path | str | None, *, order: Sequence[str] = (),
                       uploads: Uploads | None = None) -> WrittenParquet:
    """Write `frame` as ONE parquet file at `out_path` (replacing it) with Spark's writer, or, with
    `uploads` (a cluster: no disk the driver and the executors share), with Arrow's writer in the
    one task that holds every row, sent straight into the uploads' "parquet" objects.

    Without `order`, the frame's partitions are concatenated as they are (`coalesce(1)`): cheap
    and deterministic when the frame is read from stored files, but everything upstream then runs
    in the one writing task. With `order`, the upstream runs in parallel, its rows are shuffled
    into one partition and sorted by `order` (deterministic whatever the shuffle), and the `order`
    columns are dropped from the output. The file is written into a temporary folder beside
    `out_path`, so the final rename stays on one filesystem.
    """
    single = frame.repartition(1).sortWithinPartitions(*order).drop(*order) if order else frame.coalesce(1)
    if uploads is not None:
        return _send_parquet(single, uploads)
    if out_path is None:
        raise ValueError("a parquet file needs a staging path or uploads")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_name(f".{out.name}.{uuid.uuid4().hex}.spark")
    try:
        with refusing_misfits():
            (single.write.option("compression", "snappy").option("parquet.block.size", ROW_GROUP_BYTES)
             .parquet(str(work)))
        parts = sorted(work.glob("part-*.parquet"))
        if len(parts) != 1:
            raise RuntimeError(f"Spark wrote {len(parts)} part files into {work}, expected exactly one")
        os.replace(parts[0], out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return WrittenParquet(out, out.stat().st_size, pq.read_metadata(out).num_rows)


_SENT_DDL = "where STRING, bytes BIGINT, rows BIGINT"
_SENT_ARROW = pa.schema([("where", pa.string()), ("bytes", pa.int64()), ("rows", pa.int64())])


def write_row_groups(writer: pq.ParquetWriter, batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> int:
    """Write `batches` (cast to `schema`) in row groups of about ROW_GROUP_BYTES, as Spark's writer
    sizes them; the rows written."""
    rows = 0
    group: list[pa.RecordBatch] = []
    for batch in itertools.chain(batches, [None]):
        if batch is not None:
            group.append(batch)
            rows += batch.num_rows
        if group and (batch is None or sum(b.nbytes for b in group) >= ROW_GROUP_BYTES):
            table = pa.Table.from_batches(group).cast(schema)
            writer.write_table(table, row_group_size=max(1, table.num_rows))
            group = []
    return rows


def _parquet_piece(batches: Iterable[pa.RecordBatch], schema: pa.Schema, uploads: Uploads) -> tuple[str, int, int]:
    """Write `batches` as one parquet file (Arrow's writer, Spark's schema in the footer) and send it."""
    piece = PieceWriter(PARQUET_FORMAT, 0, uploads=uploads)
    try:
        with pq.ParquetWriter(piece.stream, schema, compression="snappy") as writer:
            rows = write_row_groups(writer, batches, schema)
    except BaseException:
        piece.abort()
        raise
    where, size = piece.close()
    return where, size, rows


def _parquet_task(batches: Iterable[pa.RecordBatch], schema: pa.Schema, uploads: Uploads) -> Iterator[pa.RecordBatch]:
    where, size, rows = _parquet_piece(batches, schema, uploads)
    yield pa.RecordBatch.from_pylist([{"where": where, "bytes": size, "rows": rows}], schema=_SENT_ARROW)


def _send_parquet(single: DataFrame, uploads: Uploads) -> WrittenParquet:
    """The task that holds every row writes the file; a frame without partitions is written (empty)
    by the driver. Spark's schema goes into the footer under Spark's own key, so every reader sees
    the columns' encodings as in a file Spark wrote."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(single.schema).with_metadata({SPARK_SCHEMA_KEY: single.schema.json().encode()})
    func = functools.partial(_parquet_task, schema=schema, uploads=uploads)
    with refusing_misfits():
        reports = single.mapInArrow(func, _SENT_DDL).collect()
    if len(reports) > 1:
        raise RuntimeError(f"{len(reports)} tasks wrote the one parquet file")
    where, size, rows = (reports[0]["where"], int(reports[0]["bytes"]), int(reports[0]["rows"])) if reports else \
        _parquet_piece([], schema, uploads)
    return WrittenParquet(Sent.parse(0, size, where), size, rows)


def snapshot_arrow_schema(schema: RowSchema) -> pa.Schema:
    """The Arrow schema of a snapshot's parquet file: the typed image's columns (`image_type`), with
    Spark's schema JSON under Spark's footer key, so Spark and the project's reader see each column's
    encoding as in a file Spark wrote. Every bucket's piece is written with it (parquet_pieces.py)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    image = image_type(schema)
    return to_arrow_schema(image).with_metadata({SPARK_SCHEMA_KEY: image.json().encode()})


# --- diffs ---------------------------------------------------------------------------------------------------


def _number_key(value: float | None) -> str | None:
    return None if value is None else go_v(typed_value(number_value(value)))


def _json_key(text: str | None) -> str | None:
    return None if text is None else go_v(typed_value(gojson.loads(text)))


# Python UDFs, only for key columns of FLOAT64/JSON type, only over a diff's changes (Go's %v of a
# float has no Spark SQL equivalent); integer, string and boolean keys are formatted in SQL.
# (Wrapped in lambdas: given annotated functions, PySpark tries to read a pandas UDF from the hints.)
_NUMBER_KEY = F.udf(lambda value: _number_key(value), StringType())
_JSON_KEY = F.udf(lambda text: _json_key(text), StringType())


def _key_text(cell: Column, column_type: ColumnType) -> Column:
    """Go's %v of one key cell as a typed reader holds it (`parquet.typed_value`)."""
    if column_type is ColumnType.BOOL:
        text = F.when(cell, F.lit("true")).otherwise(F.lit("false"))
    elif column_type is ColumnType.STRING:
        text = cell
    elif column_type is ColumnType.FLOAT64:
        text = _NUMBER_KEY(cell)
    elif column_type is ColumnType.JSON:
        text = _JSON_KEY(cell)
    else:
        text = cell.cast("string")
    return F.coalesce(text, F.lit("<nil>"))


def written_key(old: Column, new: Column, schema: RowSchema, key_fields: Sequence[str], change_key: Column) -> Column:
    """The diff's `key` (`keys.written_key` with `typed_value`): laredo's %v of the key values of the
    new image, else the old one, as the typed columns hold them; the change's own key string when
    that image is missing or lacks a key field."""
    image = F.when(new.isNotNull(), new).otherwise(old)
    if any(f not in schema.names for f in key_fields):
        return change_key
    gone = image.getField(ABSENT_COLUMN)
    complete = image.isNotNull() & ~F.exists(F.coalesce(gone, F.array().cast("array<string>")),
                                               lambda n: n.isin(*key_fields))
    parts = [_key_text(image.getField(f), schema.type_of(f)) for f in key_fields]
    text = parts[0] if len(parts) == 1 else F.concat(F.lit("["), F.concat_ws(" ", *parts), F.lit("]"))
    return F.when(complete, text).otherwise(change_key)


def diff_frame(net: DataFrame, schema: RowSchema, key_fields: Sequence[str], *, truncated: bool,
               new_cells: str | None = None) -> DataFrame:
    """The diff layout (action, key, old, new) of NET_DDL rows, with `__order`/`__key` to sort by:
    a TRUNCATE first when `truncated`, then the changes by their typed key. `new_cells` names a
    column of `net` holding the new images typed for `schema` already (the delta's TYPED_COLUMN):
    they are not typed again."""
    images = with_image(net, F.col("old"), schema, F.col("key"), "__old")
    images = images.withColumnRenamed(new_cells, "__new") if new_cells is not None else \
        with_image(images, F.col("new"), schema, F.col("key"), "__new")
    old, new = F.col("__old"), F.col("__new")
    changes = images.select(F.lit(1).alias("__order"), F.col("key").alias("__key"), F.col("action"),
                            written_key(old, new, schema, key_fields, F.col("change_key")).alias("key"),
                            old.alias("old"), new.alias("new"))
    if not truncated:
        return changes
    image = image_type(schema)
    layout = StructType([StructField("__order", IntegerType(), False), StructField("__key", StringType(), True),
                         StructField("action", StringType(), True), StructField("key", StringType(), True),
                         StructField("old", image, True), StructField("new", image, True)])
    first = net.sparkSession.createDataFrame([(0, None, "TRUNCATE", "", None, None)], layout)
    return first.unionByName(changes)


def write_diff(net: DataFrame, schema: RowSchema, out_path: Path | str | None, key_fields: Sequence[str], *,
               truncated: bool, uploads: Uploads | None = None, new_cells: str | None = None) -> WrittenParquet:
    """A diff artifact from net changes (NET_DDL: key, action, change_key, old, new as Go-JSON texts;
    `new_cells`: as for `diff_frame`)."""
    check_names(net.sparkSession, schema.names)
    frame = diff_frame(net, schema, key_fields, truncated=truncated, new_cells=new_cells)
    return write_parquet_file(frame, out_path, order=("__order", "__key"), uploads=uploads)
