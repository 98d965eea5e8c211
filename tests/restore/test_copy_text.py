"""COPY text is the exact inverse of the source's conversion, checked against the real server.

Values are written into a table of every type family by SQL, read back the way the PostgreSQL
source reads them (each column's output text under `SESSION_SETTINGS`, converted by its
`pgtypes` converter), passed through the archive's Go-JSON (encode, then decode with exact
integers), encoded by `CopyEncoder` with the specs resolved from the target's catalog, and COPYed
into a second table of the same types. The two tables must be equal, value for value. (A jsonb
JSON `null` is not among the values: the source's archive holds it as a missing value, the same
as SQL NULL, so it comes back as NULL; docs/operations.md says so.)
"""

from __future__ import annotations

from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
from psycopg2 import sql

from resources.subscribers import pgtypes
from snapshot_assets.archive import gojson
from snapshot_assets.restore.copy_text import CopyEncoder, encoder_of
from snapshot_assets.restore.errors import RestoreError
from snapshot_assets.restore.target import TableName, Target, connect, copy_into
from tests.pg.conftest import PgCluster

_TYPES = """
  id bigint, big bigint, small smallint, amount numeric, money2 numeric(12,2), score double precision,
  real4 real, flag boolean, blob bytea, doc jsonb, plain json, wrapped wrapped_doc, at timestamptz,
  naive timestamp, day date, span interval, uid uuid, addr inet, mood mood, note text, code varchar(8),
  ints bigint[], texts text[], blobs bytea[], docs jsonb[], grid integer[][], bounded int[]
"""
_ROWS = [
    "(1, 9223372036854775807, -32768, '12345678901234567890.000000000000000001', 1.50, 1e300, 1.5, true, "
    "'\\x00ff0a5c09'::bytea, '{\"n\": 1180591620717411303427, \"f\": 1.25, \"s\": \"a\\\\tb\", \"l\": [null, true]}', "
    "'{\"b\": 1,  \"a\": [2]}', '\"just a string\"', '2024-05-01 12:00:00.123456+00', '1999-12-31 23:59:59.5', "
    "'2024-02-29', '1 year 2 mons 3 days 04:05:06.7', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '10.1.2.3/8', 'happy', "
    "E'tab\\there\\nnew line \\\\ backslash é✓😀', 'short', '{9007199254740993,NULL,-9223372036854775808}', "
    "'{\"a,b\",\"quote\\\"d\",\"back\\\\slash\",NULL,\"\",\"NULL\"}', '{\"\\\\x00ff\",NULL}', "
    "ARRAY['{\"k\": [1, 2]}'::jsonb, NULL], '{{1,2},{3,NULL}}', '[0:1]={7,8}')",
    "(2, -9007199254740993, 0, 'NaN', -0.01, 'NaN', '-Infinity', false, ''::bytea, '\"null\"', '[]', '{}', "
    "'infinity', '-infinity', '0044-03-15 BC', '-1 days', NULL, '::1', 'sad', '', '', '{}', '{}', '{}', '{}', "
    "'{}', '{}')",
    "(3, NULL, NULL, NULL, NULL, 'Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
]

# every column; json has no equality operator, so it is compared as jsonb (no archive keeps its whitespace)
_COMPARED = ("id, big, small, amount, money2, score, real4, flag, blob, doc, plain::jsonb, wrapped, at, naive, day, "
             "span, uid, addr, mood, note, code, ints, texts, blobs, docs, grid, bounded")


def _setup(conn: psycopg2.extensions.connection) -> None:
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS copy_src, copy_dst; DROP DOMAIN IF EXISTS wrapped_doc; "
                    "DROP TYPE IF EXISTS mood")
        cur.execute("CREATE TYPE mood AS ENUM ('happy', 'sad'); CREATE DOMAIN wrapped_doc AS jsonb")
        cur.execute(f"CREATE TABLE copy_src ({_TYPES}); CREATE TABLE copy_dst ({_TYPES})")
        cur.execute("INSERT INTO copy_src VALUES " + ", ".join(_ROWS))


def _source_rows(conn: psycopg2.extensions.connection, target: Target) -> list[dict[str, Any]]:
    """copy_src as the PostgreSQL source puts it in the archive (then through Go-JSON and back)."""
    specs = target.column_specs(TableName("public", "copy_src"))
    names = [name for name, _ in specs]
    query = sql.SQL("SELECT {} FROM copy_src ORDER BY id").format(sql.SQL(", ").join(map(sql.Identifier, names)))
    with conn.cursor() as cur:
        cur.execute(query)
        oids = tuple({column.type_code for column in cur.description})
        # each value as its type's output function wrote it, as the source receives it
        psycopg2.extensions.register_type(psycopg2.extensions.new_type(oids, "AS_TEXT", lambda v, _: v), cur)
        cur.execute(query)
        texts = cur.fetchall()
    rows = []
    for values in texts:
        row = {name: pgtypes.convert(value, pgtypes.converter_of(spec))
               for (name, spec), value in zip(specs, values, strict=True)}
        rows.append(gojson.loads(gojson.encode_row(row, lambda: "?")))
    return rows


def test_copy_text_inverts_the_source_conversion(pg_cluster: PgCluster) -> None:
    conn = connect(pg_cluster.dsn())  # the source's session settings, as a restore's connection has them
    try:
        _setup(conn)
        with Target(pg_cluster.dsn(), TableName("public", "copy_dst")) as target:
            rows = _source_rows(conn, target)
            specs = target.column_specs(TableName("public", "copy_dst"))
            assert dict(specs)["wrapped"] == "json" and dict(specs)["blobs"] == "array:base64"
            encoder = CopyEncoder(specs)
            copy_into(target.conn, TableName("public", "copy_dst"), encoder.names, [encoder.batch(rows[:2]),
                                                                                     encoder.batch(rows[2:])])
        with conn.cursor() as cur:
            # json has no equality: compare it as jsonb (its text's whitespace is not kept by any archive)
            cur.execute("SELECT count(*) FROM copy_dst")
            assert cur.fetchone() == (3,)
            a, b = (f"SELECT {_COMPARED} FROM {t}" for t in ("copy_src", "copy_dst"))
            cur.execute(f"SELECT count(*) FROM (({a} EXCEPT ALL {b}) UNION ALL ({b} EXCEPT ALL {a})) d")
            assert cur.fetchone() == (0,)
            # exact representations, beyond what equality shows
            cur.execute("SELECT big::text, amount::text, doc::text, bounded::text, naive::text "
                        "FROM copy_dst WHERE id = 1")
            assert cur.fetchone() == ("9223372036854775807", "12345678901234567890.000000000000000001",
                                      '{"f": 1.25, "l": [null, true], "n": 1180591620717411303427, "s": "a\\\\tb"}',
                                      "[0:1]={7,8}", "1999-12-31 23:59:59.5")
    finally:
        conn.close()


def test_a_row_with_a_column_the_table_lacks_is_refused() -> None:
    encoder = CopyEncoder([("id", "int"), ("name", "text")])
    assert encoder.batch([{"id": 1, "name": None}, {"id": 2}]) == b"1\t\\N\n2\t\\N\n"
    with pytest.raises(RestoreError, match=r"columns the restored table does not have: \['extra'\]"):
        encoder.batch([{"id": 1, "extra": "x"}])
    with pytest.raises(RestoreError, match="not base64"):
        encoder_of("base64")("not*base64")
    with pytest.raises(RestoreError, match="no COPY encoding"):
        encoder_of("array:nonsense")
