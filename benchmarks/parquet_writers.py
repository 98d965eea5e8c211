"""Parquet snapshot of N rows: the Python writer in Spark tasks vs Spark's own writer, same state.

The state is what a snapshot build holds: `key, row` with each row as Go-JSON text, N rows of the
issue's 8-column table shape (bigint id, text, text, float8, bool, numeric as text, timestamptz as
text, int4[]), written once to a parquet dataset. Then, each on the same session:

- python: `parts.encode_snapshot_parts` (every task decodes its rows and spools them through the
  Python parquet writer: the path the snapshot build uses today), one part file per task;
- spark: `parquet_artifact.typed_columns` with the schema from the table's columns, written into
  a state dataset beside the rows (the typing a row gets once, when it enters the state), then
  `write_snapshot` from that dataset (Spark's parquet writer, one file); and both in one job;
- the schema inference a schemaless source needs once per epoch.

Prints seconds, bytes and the machine load (`uptime`) before and after. Not a test: run it by hand.

Run: `.venv/bin/python benchmarks/parquet_writers.py [--rows 1000000]`
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from snapshot_assets.archive.row_schema import RowSchema  # noqa: E402
from snapshot_assets.spark.parquet_artifact import infer_row_schema, typed_columns, write_snapshot  # noqa: E402
from snapshot_assets.spark.parts import collect_parts, encode_snapshot_parts, prepare_staging  # noqa: E402
from snapshot_assets.spark.session import LOCAL_DEFAULTS, classic_session  # noqa: E402

COLUMNS = [("active", 16), ("balance", 1700), ("email", 25), ("id", 20), ("name", 25), ("score", 701),
           ("tags", 1007), ("updated_at", 1184)]

# Keys in Go-JSON order (sorted); values shaped like the generator's rows.
ROW_SQL = """to_json(named_struct(
  'active', id % 5 <> 0,
  'balance', format_string('%d.%02d', id % 100000, id % 100),
  'email', concat('user', id, '@example.com'),
  'id', id + 9007199254740993,
  'name', concat('name-', id),
  'score', CAST(id % 100000 AS DOUBLE) / 8 + 0.0625,
  'tags', slice(array(1, 2, 3), 1, CAST(id % 4 AS INT)),
  'updated_at', concat('2026-01-0', CAST(id % 9 + 1 AS STRING), 'T12:00:00.5Z')))"""


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    spark = classic_session("local[2]", {**LOCAL_DEFAULTS, "spark.driver.memory": "2g"}, "parquet-writers")
    spark.sparkContext.setLogLevel("ERROR")
    schema = RowSchema.from_manifest_columns(
        [{"Name": n, "TypeOID": oid, "OrdinalPosition": i + 1} for i, (n, oid) in enumerate(COLUMNS)])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (spark.range(args.rows).selectExpr("to_json(array(id + 9007199254740993)) AS key", f"{ROW_SQL} AS row")
         .repartition(4).write.parquet(str(root / "state")))
        print(f"rows: {args.rows}; load before: {_uptime()}")

        def state() -> object:
            return spark.read.parquet(str(root / "state"))

        started = time.monotonic()
        staging = prepare_staging(root / "staging", ["parquet"])
        staged, count = collect_parts(encode_snapshot_parts(state(), staging, ["parquet"], ["id"]),  # type: ignore[arg-type]
                                      ["parquet"])
        python_s = time.monotonic() - started
        print(f"python writer (Spark tasks, {len(staged['parquet'].parts)} part files): {python_s:.1f} s, "
              f"{staged['parquet'].bytes} bytes, {count} rows")

        started = time.monotonic()
        typed_columns(state(), schema).write.parquet(str(root / "typed-state"))  # type: ignore[arg-type]
        typing_s = time.monotonic() - started
        started = time.monotonic()
        written = write_snapshot(spark.read.parquet(str(root / "typed-state")), root / "spark.parquet")
        file_s = time.monotonic() - started
        print(f"spark: typing the state (key, row, typed columns; parallel): {typing_s:.1f} s; "
              f"snapshot file from the typed state (one task): {file_s:.1f} s, {written.bytes} bytes, "
              f"{written.rows} rows")

        started = time.monotonic()
        written = write_snapshot(typed_columns(state(), schema), root / "one-go.parquet",  # type: ignore[arg-type]
                                 order_by="key")
        print(f"spark: typing + snapshot file in one job (sorted by key): {time.monotonic() - started:.1f} s, "
              f"{written.bytes} bytes")

        started = time.monotonic()
        inferred = infer_row_schema(state())  # type: ignore[arg-type]
        print(f"spark: schema inference (schemaless sources): {time.monotonic() - started:.1f} s, "
              f"same schema as the manifest's: {inferred == schema}")
        print(f"load after: {_uptime()}")
    spark.stop()


if __name__ == "__main__":
    main()
