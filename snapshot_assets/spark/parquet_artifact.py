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
#
# The typing expressions are written as Spark SQL text and handed to the JVM one projection at a
# time. Built with `pyspark.sql.functions`, the same expressions cost a py4j round trip per function
# on a classic session: about 13,000 calls (several seconds) for one diff of an 8-column table,
# whatever its size. As text, a projection is one call.

Sql = str
"""A Spark SQL expression's text."""


def _q(name: str) -> Sql:
    """A column reference by name, whatever characters the name holds."""
    return "`" + name.replace("`", "``") + "`"


def _s(text: str) -> Sql:
    """A constant string expression of `text`. Quoted when it holds no quote or backslash; else its
    UTF-8 bytes decoded (still a constant): how a literal's backslashes read depends on the session
    setting `spark.sql.parser.escapedStringLiterals`, the bytes do not."""
    if "'" not in text and "\\" not in text:
        return f"'{text}'"
    return f"decode(X'{text.encode().hex()}', 'UTF-8')"


def _d(value: float) -> Sql:
    """A DOUBLE literal."""
    return f"{value!r}D"


def _in(value: Sql, *options: str) -> Sql:
    return f"({value} IN ({', '.join(_s(o) for o in options)}))"


def _kind_of(kind: Sql, raw: Sql) -> Sql:
    """One of the `row_schema.KIND_*` names of a member, from its `schema_of_variant` (`kind`, null
    when absent) and its raw text; 'absent' when the row lacks it."""
    integer = f"CASE WHEN try_cast({raw} AS BIGINT) IS NULL THEN {_s(KIND_BIGINT)} ELSE {_s(KIND_INT)} END"
    return (f"CASE WHEN {kind} IS NULL THEN {_s(_KIND_ABSENT)}"
            f" WHEN {kind} = 'VOID' THEN {_s(KIND_NULL)}"
            f" WHEN {kind} = 'STRING' THEN {_s(KIND_STRING)}"
            f" WHEN {kind} = 'BOOLEAN' THEN {_s(KIND_BOOL)}"
            f" WHEN startswith({kind}, 'OBJECT') OR startswith({kind}, 'ARRAY') THEN {_s(KIND_NESTED)}"
            f" WHEN {raw} RLIKE {_s(_INT_TOKEN)} THEN {integer}"
            f" ELSE {_s(KIND_FLOAT)} END")


def _raw_map(text: Sql) -> Sql:
    """member -> its JSON text (a string member: its contents); null when not a JSON object."""
    return f"from_json({text}, 'MAP<STRING,STRING>')"


def _variant_map(text: Sql) -> Sql:
    """member -> its value as a variant (what kind it is; JSON null is a VOID variant)."""
    return f"from_json({text}, 'MAP<STRING,VARIANT>')"


def _exact_digits(value: Sql) -> Sql:
    """The exact decimal digits of an integral double below 1e21, without its sign. (Spark's double
    to decimal cast goes through Double.toString, whose digits are not exact, so go through BIGINT:
    exact below 2^63, and above it the double is a multiple of 2048, so value/1024 is exact.)"""
    magnitude = f"abs({value})"
    big = f"CAST(try_cast({magnitude} / 1024 AS BIGINT) AS DECIMAL(38,0)) * CAST(1024 AS DECIMAL(38,0))"
    return (f"CASE WHEN {magnitude} < {_d(float(2**62))} THEN CAST(try_cast({magnitude} AS BIGINT) AS STRING)"
            f" WHEN {magnitude} < {_d(1e21)} THEN CAST(CAST({big} AS DECIMAL(38,0)) AS STRING) END")


def _round_significant(digits: Sql, n: Sql) -> Sql:
    """The integer written as `digits` rounded half-even to `n` significant digits, as DECIMAL(38,0)."""
    width = f"length({digits})"
    cut = f"greatest({width} - ({n}), 0)"
    head = f"CAST(substr({digits}, 1, {width} - {cut}) AS DECIMAL(38,0))"
    tail = f"substr({digits}, {width} - {cut} + 1, {cut})"
    half = f"concat('5', repeat('0', greatest({cut} - 1, 0)))"
    up = f"({cut} > 0) AND (({tail} > {half}) OR (({tail} = {half}) AND (({head} % 2) = 1)))"
    rounded = f"{head} + CASE WHEN {up} THEN 1 ELSE 0 END"
    return f"CAST(concat(CAST({rounded} AS STRING), repeat('0', {cut})) AS DECIMAL(38,0))"


def _reads_back_as(cell: Sql, raw: Sql, digits: Sql) -> Sql:
    """Whether a double `cell` parsed from the integer token `raw` reads back as `raw`
    (`number_value`: below 2^53 the integer itself, above it the shortest round-trip digits padded
    with zeros, which is what Go writes for a double); `digits` are `_exact_digits(cell)`. Checked
    exactly in decimal arithmetic: `raw` must be the double's digits correctly rounded to its own
    significant length, and no shorter rounding may give the same double. Java's Double.toString
    is not used: before JDK 19 it sometimes prints a digit too many."""
    magnitude = f"abs({cell})"
    small = f"({magnitude} < {_d(float(2**53))}) AND (try_cast({cell} AS BIGINT) = try_cast({raw} AS BIGINT))"
    wanted = f"regexp_replace({raw}, '^-', '')"
    significant = f"length(regexp_replace({wanted}, '0+$', ''))"
    closest = f"{_round_significant(digits, significant)} = try_cast({wanted} AS DECIMAL(38,0))"
    shortest = (f"({significant} <= 1)"
                f" OR (CAST({_round_significant(digits, f'{significant} - 1')} AS DOUBLE) != {magnitude})")
    large = (f"({magnitude} >= {_d(float(2**53))}) AND ({magnitude} < {_d(1e21)})"
             f" AND ({closest}) AND ({shortest})")
    return f"(({small}) OR ({large}))"


def _cell(column_type: ColumnType, kind: Sql, raw: Sql, member: Sql) -> Sql:
    """The typed cell of one member (null where it does not fit; `_fits` says which)."""
    if column_type is ColumnType.BOOL:
        return f"CASE WHEN {kind} = {_s(KIND_BOOL)} THEN {raw} = 'true' END"
    if column_type in (ColumnType.INT16, ColumnType.INT32, ColumnType.INT64):
        sql_type = SPARK_TYPES[column_type].simpleString()
        return f"CASE WHEN {kind} = {_s(KIND_INT)} THEN try_cast({raw} AS {sql_type}) END"
    if column_type is ColumnType.FLOAT64:
        named = f"({kind} = {_s(KIND_STRING)}) AND {_in(raw, *_FLOAT_NAMES)}"
        number = _in(kind, KIND_INT, KIND_BIGINT, KIND_FLOAT)
        return f"CASE WHEN {number} OR ({named}) THEN try_cast({raw} AS DOUBLE) END"
    if column_type is ColumnType.STRING:
        return f"CASE WHEN {kind} = {_s(KIND_STRING)} THEN {raw} END"
    return (f"CASE WHEN {kind} = {_s(KIND_STRING)} THEN to_json({member})"
            f" WHEN NOT {_in(kind, _KIND_ABSENT, KIND_NULL)} THEN {raw} END")


def _fits(column_type: ColumnType, kind: Sql, raw: Sql, cell: Sql, digits: Sql | None) -> Sql:
    """Whether the member reads back exactly from `cell` (absent and null members always do)."""
    empty = _in(kind, _KIND_ABSENT, KIND_NULL)
    if column_type is ColumnType.BOOL:
        return f"{empty} OR ({kind} = {_s(KIND_BOOL)})"
    if column_type in (ColumnType.INT16, ColumnType.INT32, ColumnType.INT64):
        return f"{empty} OR ({cell} IS NOT NULL)"
    if column_type is ColumnType.FLOAT64:
        assert digits is not None
        named = f"({kind} = {_s(KIND_STRING)}) AND {_in(raw, *_FLOAT_NAMES)}"
        fraction = (f"({kind} = {_s(KIND_FLOAT)}) AND ({cell} IS NOT NULL)"
                    f" AND NOT ((abs({cell}) < {_d(1e21)}) AND ({cell} % 1 = 0))")
        integral = f"{_in(kind, KIND_INT, KIND_BIGINT)} AND coalesce({_reads_back_as(cell, raw, digits)}, false)"
        return f"{empty} OR ({named}) OR ({fraction}) OR ({integral})"
    if column_type is ColumnType.STRING:
        return f"{empty} OR ({kind} = {_s(KIND_STRING)})"
    return "true"


def _ref(name: str) -> Column:
    return F.col(_q(name))


def _array(items: Sequence[Sql], element: str = "STRING") -> Sql:
    """An array of `items` (typed even when empty)."""
    return f"array({', '.join(items)})" if items else f"CAST(array() AS ARRAY<{element}>)"


def with_image(frame: DataFrame, text_column: Column, schema: RowSchema, key: Column, into: str) -> DataFrame:
    """`frame` plus the struct column `into`: the typed image (`image_type(schema)`) of the Go-JSON
    `text_column` (null where it is null). Evaluating it raises (see `refusing_misfits`) when a member
    does not fit, naming `key`.

    Built as a few projections (parse, classify, cast, check, assemble) rather than one expression:
    each step refers to the previous step's columns, which keeps the plan small (one expression
    repeating the classification in every check makes Catalyst's optimizer crawl)."""
    t = f"__{into}_"

    def c(name: str) -> Sql:  # a scratch column of this image
        return _q(t + name)

    def r(i: int) -> Sql:  # the raw text of column i
        return c(f"r{i}")

    def k(i: int) -> Sql:  # its kind
        return c(f"k{i}")

    def d(i: int) -> Sql:  # a FLOAT64 cell's exact digits
        return c(f"d{i}")

    keep = [_ref(name) for name in frame.columns if name != into]
    columns = list(enumerate(schema.columns))
    floats = [(i, col) for i, col in columns if col.type is ColumnType.FLOAT64]
    raw, text = c("raw"), c("text")
    staged = frame.select(*keep, text_column.alias(t + "text"), key.cast("string").alias(t + "key"))
    staged = staged.selectExpr("*", f"{_raw_map(text)} AS {raw}", f"{_variant_map(text)} AS {c('var')}")
    member = {i: f"try_element_at({c('var')}, {_s(col.name)})" for i, col in columns}
    staged = staged.selectExpr("*", *[x for i, col in columns for x in (
        f"try_element_at({raw}, {_s(col.name)}) AS {r(i)}", f"schema_of_variant({member[i]}) AS {c(f'v{i}')}")])
    staged = staged.selectExpr("*", *[f"{_kind_of(c(f'v{i}'), r(i))} AS {k(i)}" for i, _ in columns])
    staged = staged.selectExpr("*", *[f"{_cell(col.type, k(i), r(i), member[i])} AS {c(f'c{i}')}"
                                      for i, col in columns])
    staged = staged.selectExpr("*", *[f"{_exact_digits(c(f'c{i}'))} AS {d(i)}" for i, _ in floats])
    staged = staged.selectExpr("*", *[
        f"{_fits(col.type, k(i), r(i), c(f'c{i}'), d(i) if col.type is ColumnType.FLOAT64 else None)} AS {c(f'f{i}')}"
        for i, col in columns])
    # No lambdas (higher-order functions are interpreted, row by row): count the members the
    # schema names, and only name an unknown one when there is one.
    present = " + ".join(f"CAST({k(i)} != {_s(_KIND_ABSENT)} AS INT)" for i, _ in columns) or "0"
    names = _array([_s(name) for name in schema.names])
    unknown = f"CASE WHEN size({raw}) > ({present}) THEN try_element_at(array_except(map_keys({raw}), {names}), 1) END"
    misfits = [f"CASE WHEN NOT {c(f'f{i}')} THEN {_s(col.name)} END" for i, col in columns]
    staged = staged.selectExpr("*", f"coalesce({', '.join([*misfits, unknown])}) AS {c('misfit')}")
    misfit = c("misfit")
    lacking = [f"CASE WHEN {k(i)} = {_s(_KIND_ABSENT)} THEN {_s(col.name)} END" for i, col in columns]
    absent = f"array_compact({_array(lacking)})" if columns else _array([])
    types = (f"map({', '.join(f'{_s(col.name)}, {_s(col.type.value)}' for col in schema.columns)})"
             if schema.columns else "CAST(map() AS MAP<STRING,STRING>)")
    report = (f"to_json(named_struct('column', CASE WHEN {raw} IS NOT NULL THEN {misfit} END, 'key', {c('key')},"
              f" 'type', coalesce(try_element_at({types}, {misfit}), 'no such column'),"
              f" 'value', substring(coalesce(try_element_at({raw}, {misfit}), {text}), 1, 200)))")
    guarded = (f"CASE WHEN {raw} IS NULL OR {misfit} IS NOT NULL"
               f" THEN raise_error(concat({_s(MISFIT_MARKER)}, {report}))"
               f" ELSE CASE WHEN size({absent}) > 0 THEN {absent} END END")
    # Named through Column aliases: named_struct wants its names as literals, which a name with a
    # quote or backslash is not (`_s`).
    fields = [F.col(c(f"c{i}")).alias(col.name) for i, col in columns] + [F.expr(guarded).alias(ABSENT_COLUMN)]
    image = F.struct(*fields).cast(image_type(schema))
    return staged.select(*keep, F.when(F.col(text).isNotNull(), image).alias(into))


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
    parsed = rows.selectExpr(f"{_raw_map('t')} AS raw", f"{_variant_map('t')} AS var")
    members = parsed.selectExpr("explode(map_keys(var)) AS name", "raw", "var")
    kind = _kind_of("schema_of_variant(try_element_at(var, name))", "try_element_at(raw, name)")
    kinds = members.selectExpr("name", f"{kind} AS kind").groupBy("name").agg(F.collect_set("kind").alias("kinds"))
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
               new_cells: str | None = None, befores: bool = True) -> DataFrame:
    """The diff layout (action, key, old, new) of NET_DDL rows, with `__order`/`__key` to sort by:
    a TRUNCATE first when `truncated`, then the changes by their typed key. `new_cells` names a
    column of `net` holding the new images typed for `schema` already (the delta's TYPED_COLUMN):
    they are not typed again. `befores=False` says no change has a before-image (a window of
    INSERTs only, `effects.WindowFacts.befores`): `old` is then null without typing projections,
    which are half of a small diff's planning and code generation."""
    if befores:
        images = with_image(net, F.col("old"), schema, F.col("key"), "__old")
    else:
        images = net.withColumn("__old", F.lit(None).cast(image_type(schema)))
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
               truncated: bool, uploads: Uploads | None = None, new_cells: str | None = None,
               befores: bool = True) -> WrittenParquet:
    """A diff artifact from net changes (NET_DDL: key, action, change_key, old, new as Go-JSON texts;
    `new_cells` and `befores`: as for `diff_frame`)."""
    check_names(net.sparkSession, schema.names)
    frame = diff_frame(net, schema, key_fields, truncated=truncated, new_cells=new_cells, befores=befores)
    return write_parquet_file(frame, out_path, order=("__order", "__key"), uploads=uploads)
