"""The PostgreSQL side of a restore: connections, the staging table, the swap, the cleanup.

Parallel writers cannot share one transaction, so atomicity comes from a name: the rows go into a
staging table that nothing else knows (`<target>__restore_<random>` in the target's schema, its
comment naming the target), and one transaction on the driver's connection puts it in place
(with --replace, dropping the old table in the same transaction). Readers of the target see the
old table or the whole new one, never a part. A failure drops the staging table; a restore that
was killed leaves it behind, and the next restore of the same target drops it first. While a
restore runs it holds a session advisory lock on the target's name, so a second restore of that
target fails (after waiting `LOCK_WAIT_S` for a restore that is just ending) instead of dropping
the first one's staging table.

The restored table has the manifest's column types and NOT NULLs and the archive's key as its
primary key (added after the load, which is faster than checking it per row); defaults,
indexes, other constraints and grants are not in the archive and are not made.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from resources.subscribers import pgtypes
from snapshot_assets.redaction import dsn_problem, redact, register_dsn
from snapshot_assets.restore.errors import RestoreError
from snapshot_assets.restore.point import TargetColumn

Connection = Any  # a psycopg2 connection (the package ships no type information)

STAGING_MARK: Final = "__restore_"
_COMMENT: Final = "snapshotter restore staging for "
_LOCK_CLASS: Final = 0x5E570  # the advisory-lock namespace of restores (first key of the pair)
#: How long a restore waits for the target's lock before it calls the holder another running restore.
#: Why wait at all: a restore that has just ended releases the lock when PostgreSQL's backend for its
#: session exits, which can come after the restore's own process has (the suite saw a restore started
#: right after another of the same target refused as concurrent).
LOCK_WAIT_S: Final = 5.0
_MAX_IDENTIFIER: Final = 63  # NAMEDATALEN - 1: PostgreSQL truncates longer names silently


@dataclass(frozen=True, slots=True)
class TableName:
    """A schema-qualified table name in the target database."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str, default_schema: str = "public") -> TableName:
        """`name` or `schema.name` (unquoted; a dot splits schema from name)."""
        schema, dot, name = text.rpartition(".")
        schema = schema or ("" if dot else default_schema)
        for part in (schema, name):
            if not part or len(part.encode()) > _MAX_IDENTIFIER:
                raise RestoreError(f"{text!r} is not a table name (schema.name, each part 1-{_MAX_IDENTIFIER} bytes)")
        return cls(schema, name)

    @property
    def ident(self) -> sql.Composed:
        return sql.Identifier(self.schema, self.name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


def pg_error(exc: BaseException) -> str:
    """A PostgreSQL error in one line: its message and, when there is one, where (`COPY t, line 2, column c`)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    context = next((line.removeprefix("CONTEXT:").strip() for line in lines if line.startswith("CONTEXT:")), "")
    return f"{lines[0]} ({context})" if context else lines[0]


def connect(dsn: str) -> Connection:
    """A connection to the target database under the source's session settings (the same text
    forms the archive's values were read in); a RestoreError naming what is wrong otherwise."""
    register_dsn(dsn)
    problem = dsn_problem(dsn)
    if problem is not None:
        raise RestoreError(f"--into: {problem}")
    try:
        conn = psycopg2.connect(dsn)
    except psycopg2.Error as exc:
        raise RestoreError(f"cannot connect to the target database: {redact(pg_error(exc))}") from None
    conn.autocommit = True
    with conn.cursor() as cur:
        for name, value in pgtypes.SESSION_SETTINGS.items():
            cur.execute("SELECT set_config(%s, %s, false)", (name, value))
    return conn


class _Chunks(io.RawIOBase):
    """A file over an iterator of byte chunks: what psycopg2's COPY reads from, one batch at a time."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def copy_into(conn: Connection, table: TableName, names: Sequence[str], chunks: Iterable[bytes]) -> None:
    """COPY the text payloads `chunks` into `table`'s columns `names` in one COPY command."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(table.ident, sql.SQL(", ").join(map(sql.Identifier, names)))
    with conn.cursor() as cur:
        cur.copy_expert(statement.as_string(conn), io.BufferedReader(_Chunks(chunks), 1 << 20), size=1 << 20)


class Target:
    """The target table of one restore, on the driver's connection (see the module docstring)."""

    def __init__(self, dsn: str, name: TableName) -> None:
        self.dsn = dsn
        self.name = name
        self.conn = connect(dsn)

    def __enter__(self) -> Target:
        try:
            self._lock()
        except BaseException:
            self.conn.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()  # ends the session: the advisory lock goes with it

    def _fetch(self, query: str | sql.Composable, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(query, args)
            return list(cur.fetchall())

    def _lock(self) -> None:
        if not self._fetch("SELECT to_regnamespace(%s) IS NOT NULL", (self.name.schema,))[0][0]:
            raise RestoreError(f"schema {self.name.schema!r} does not exist in the target database")
        deadline = time.monotonic() + LOCK_WAIT_S
        while not self._fetch("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (_LOCK_CLASS, str(self.name)))[0][0]:
            if time.monotonic() >= deadline:
                raise RestoreError(f"another restore of {self.name} is running (it holds the target's advisory lock)")
            time.sleep(0.1)

    def exists(self) -> bool:
        return bool(self._fetch("SELECT to_regclass(%s) IS NOT NULL", (self.name.ident.as_string(self.conn),))[0][0])

    def exists_error(self) -> RestoreError:
        return RestoreError(f"table {self.name} exists in the target database: restore into another "
                            "--target-table, or pass --replace to swap it")

    def leftovers(self) -> list[TableName]:
        """Staging tables of this target that a killed restore left (under the lock: none is live)."""
        rows = self._fetch(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r' AND strpos(c.relname, %s) > 0 "
            "AND obj_description(c.oid, 'pg_class') = %s",
            (self.name.schema, STAGING_MARK, _COMMENT + str(self.name)))
        return [TableName(self.name.schema, relname) for (relname,) in rows]

    def drop(self, table: TableName) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table.ident))

    def create_staging(self, columns: Sequence[TargetColumn]) -> TableName:
        """A new, empty staging table with the columns' types (checked to exist in the target)."""
        for column in columns:
            try:
                known = self._fetch("SELECT to_regtype(%s) IS NOT NULL", (column.type_sql,))[0][0]
            except psycopg2.Error:
                known = False
            if not known:
                raise RestoreError(f"column {column.name!r} has type {column.type_sql!r}, which the target database "
                                   "does not know: create the type there first")
        staging = TableName(self.name.schema, f"{self.name.name[:32]}{STAGING_MARK}{uuid.uuid4().hex[:8]}")
        defs = sql.SQL(", ").join(
            sql.SQL("{} {}{}").format(sql.Identifier(c.name), sql.SQL(c.type_sql),  # checked by to_regtype above
                                      sql.SQL("" if c.nullable else " NOT NULL")) for c in columns)
        with self.conn.cursor() as cur:
            cur.execute(sql.SQL("CREATE TABLE {} ({})").format(staging.ident, defs))
            cur.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(staging.ident,
                                                                     sql.Literal(_COMMENT + str(self.name))))
        return staging

    def column_specs(self, table: TableName) -> list[tuple[str, str]]:
        """(name, `pgtypes` converter spec) of each column of `table`, resolved from the target's catalog."""
        rows = self._fetch("SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s::regclass "
                           "AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (table.ident.as_string(self.conn),))

        def describe(oid: int) -> pgtypes.PgType | None:
            found = self._fetch(pgtypes.PG_TYPE_QUERY, (oid,))
            return pgtypes.pg_type_of(oid, found[0] if found else None)

        converters = pgtypes.Converters(describe)
        return [(str(name), converters.spec(int(oid))) for name, oid in rows]

    def count(self, table: TableName) -> int:
        return int(self._fetch(sql.SQL("SELECT count(*) FROM {}").format(table.ident))[0][0])

    def swap_in(self, staging: TableName, key_fields: Sequence[str], *, replace: bool) -> None:
        """Give `staging` its primary key, then, in one transaction, put it in place of the target."""
        staging_key = f"{staging.name}_pk"
        with self.conn.cursor() as cur:
            try:
                cur.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
                    staging.ident, sql.Identifier(staging_key), sql.SQL(", ").join(map(sql.Identifier, key_fields))))
            except psycopg2.errors.UniqueViolation as exc:
                raise RestoreError(f"the restored rows repeat a key of {list(key_fields)}: {pg_error(exc)}") from None
        self.conn.autocommit = False
        try:
            with self.conn.cursor() as cur:
                if self.exists():
                    if not replace:
                        raise self.exists_error()
                    cur.execute(sql.SQL("DROP TABLE {}").format(self.name.ident))
                cur.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(staging.ident,
                                                                          sql.Identifier(self.name.name)))
                cur.execute(sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
                    self.name.ident, sql.Identifier(staging_key), sql.Identifier(f"{self.name.name[:58]}_pkey")))
                cur.execute(sql.SQL("COMMENT ON TABLE {} IS NULL").format(self.name.ident))
            self.conn.commit()
        except psycopg2.Error as exc:
            self.conn.rollback()
            raise RestoreError(f"cannot put the restored table in place of {self.name}: {pg_error(exc)}") from None
        except BaseException:
            self.conn.rollback()
            raise
        finally:
            self.conn.autocommit = True
