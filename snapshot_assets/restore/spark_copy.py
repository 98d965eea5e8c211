"""The large-table path: the Spark reconstruction's tasks COPY their own partitions into the staging table.

No Spark JDBC writer is used (it needs a driver jar on every executor); each task opens its own
psycopg2 connection, decodes its rows once (Go-JSON text, exact integers) and streams them, a
batch of COPY text at a time, in ONE transaction per task: a task that fails commits nothing, so
Spark's retry of it does not write its rows twice. Each task reports its row count; the driver
swaps the staging table in only when every task committed (`run.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from snapshot_assets.restore.copy_text import CopyEncoder
from snapshot_assets.restore.errors import RestoreError
from snapshot_assets.restore.target import TableName, connect, copy_into
from snapshot_assets.spark.effects import decode_row

_COUNT_DDL = "rows BIGINT"
_TRACEBACK = "Traceback (most recent call last):"


def _copy_task(batches: Iterable[Any], dsn: str, staging: TableName, specs: tuple[tuple[str, str], ...]
               ) -> Iterator[Any]:
    encoder = CopyEncoder(specs)
    count = 0

    def chunks() -> Iterator[bytes]:
        nonlocal count
        for batch in batches:
            rows = [row for text in batch.column(0).to_pylist() if (row := decode_row(text)) is not None]
            count += len(rows)
            yield encoder.batch(rows)

    conn = connect(dsn)
    try:
        conn.autocommit = False
        copy_into(conn, staging, encoder.names, chunks())
        conn.commit()
    finally:
        conn.close()
    yield pa.RecordBatch.from_pydict({"rows": [count]}, schema=pa.schema([("rows", pa.int64())]))


def spark_copy(table: DataFrame, dsn: str, staging: TableName, specs: Sequence[tuple[str, str]]) -> int:
    """COPY the STATE_DDL (key, row) frame `table` into `staging` from the tasks; the row count."""
    func = functools.partial(_copy_task, dsn=dsn, staging=staging, specs=tuple(specs))
    try:
        counts = table.select("row").mapInArrow(func, _COUNT_DDL).collect()
    except RestoreError:
        raise
    except Exception as exc:  # a task's failure, wrapped by Spark with the worker's traceback
        raise RestoreError(f"the Spark copy into {staging} failed: {task_error(exc)}") from None
    return sum(int(r["rows"]) for r in counts)


def task_error(exc: BaseException) -> str:
    """The Python error a Spark task died of (the unindented line after the worker's last traceback,
    e.g. `NumericValueOutOfRange: value ... is out of range for type smallint`), else the first line."""
    text = str(exc)
    _, marker, tail = text.rpartition(_TRACEBACK)
    for line in tail.splitlines() if marker else ():
        if line.strip() and not line[0].isspace():
            name, _, message = line.partition(": ")
            return f"{name.rsplit('.', 1)[-1]}: {message}" if message else line
    lines = text.splitlines()
    return lines[0] if lines else type(exc).__name__
