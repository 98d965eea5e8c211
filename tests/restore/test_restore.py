"""Restore, end to end: a live PostgreSQL table archived by the real pipeline, then restored into the
private cluster as of its pinned initial snapshot and as of positions after changes and deletes.

The archive is made once for the module by `snapshotter run --once` (logical replication, the
change buffer, Spark, the manifest commit), in three runs with transactions between them: the
initial snapshot, then two diffs. Right after each transaction the test copies the source table
(`CREATE TABLE oracle_<n> AS SELECT * FROM ...`): no change happens before the next run, so that
copy IS the source table at the boundary the run commits. Every restore is compared with the
copy of its point by `EXCEPT ALL` both ways over every column (numeric, timestamptz, jsonb, bytea,
bigint beyond 2^53, large TOASTed text, text[], NULLs), and its column types and primary key with
the source's. Both paths run: the streamed one (one process) and the Spark one (tasks COPY).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg2
import pytest

from resources.destinations.local import LocalDestination
from snapshot_assets import cli, tables
from snapshot_assets.archive.keys import manifest_key
from snapshot_assets.archive.manifest import loads, rfc3339
from snapshot_assets.archive.pins import ORIGIN_INITIAL, Pin, pin_of, with_pin
from snapshot_assets.archive.positions import parse_lsn
from snapshot_assets.restore.errors import RestoreError
from snapshot_assets.restore.run import RestoreResult, fixed_session, restore_table
from snapshot_assets.restore.target import TableName, Target
from snapshot_assets.spark.connect_server import stop_local_connect_server
from tests.e2e.conftest import e2e_env
from tests.e2e.test_postgres_rounds import run_once
from tests.pg.conftest import PgCluster

pytestmark = pytest.mark.slow

SOURCE = "restore_src"
LABEL = "go-live"  # the initial snapshot's label, unless the pipeline labelled it itself
_DEFINITION = """
  tenant text NOT NULL, id bigint NOT NULL, big bigint, amount numeric, doc jsonb, at timestamptz, blob bytea,
  note text, score double precision, tags text[], PRIMARY KEY (tenant, id)
"""
_COLUMNS = ("tenant", "id", "big", "amount", "doc", "at", "blob", "note", "score", "tags")


@dataclass(frozen=True)
class Archived:
    """The module's archive, and the source table's copy at each point."""

    config: Path
    archive: Path
    dsn: str
    label: str  # the pinned initial snapshot's label
    initial: str  # its position
    mid: str  # the first diff's end
    last: str  # the second diff's end (the head)

    def destination(self) -> LocalDestination:
        return LocalDestination(self.archive)


def _row(rng: random.Random, tenant: str, ident: int) -> tuple[Any, ...]:
    big = rng.choice((2**53 + 1, -(2**53) - 3, 2**63 - 1, -(2**63), rng.randint(-1000, 1000), None))
    amount = rng.choice(("123456789012345678901234567890.000000000001", "-0.5", "NaN", "0", None))
    doc = rng.choice(({"n": 2**70 + 1, "f": 0.125, "s": "tab\there \"q\" é", "l": [None, True, {"d": []}]},
                      {"big": 2**53 + 7}, [1, "two"], "a string", None))
    at = rng.choice((dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=rng.randrange(2**52)),
                     "infinity", None))
    blob = rng.choice((bytes(range(256)), rng.randbytes(rng.randint(0, 40)), b"", None))
    note = rng.choice(("".join(rng.choice("ab\t\n\\é✓😀 ") for _ in range(120_000)), "line\nnext\ttab\\", "", None))
    score = rng.choice((1e300, -2.5e-300, float("nan"), float("inf"), 0.1, None))
    tags = rng.choice((["a,b", 'q"uote', "back\\slash", None, "", "NULL"], [], None))
    return (tenant, ident, big, amount, None if doc is None else json.dumps(doc), at,
            None if blob is None else psycopg2.Binary(blob), note, score, tags)


def _insert(cur: Any, rows: list[tuple[Any, ...]]) -> None:
    cur.executemany(f"INSERT INTO {SOURCE} VALUES (%s, %s, %s, %s::numeric, %s::jsonb, %s, %s, %s, %s, %s)", rows)


def _snapshot_source(conn: Any, name: str) -> None:
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}; CREATE TABLE {name} AS SELECT * FROM {SOURCE}")


def _write_config(path: Path, dsn: str, work: Path) -> None:
    path.write_text(f"""
snapshotter {{
  source {{
    type = postgres
    dsn = "{dsn}"
    schema = public
    table = {SOURCE}
    slot = {SOURCE}_slot
    publication = {SOURCE}_pub
  }}
  diff.interval = 1s
  snapshot {{ min_interval = 0s, max_churn_records = 0 }}
  retention.keep_epochs = 0
  destinations = [ {{ type = local, path = "{work / 'archive'}" }} ]
  formats {{
    snapshot = [jsonl, parquet]
    diff = [jsonl]
  }}
  buffer {{ path = "{work / 'buffer'}", seal_interval = 200ms }}
}}
""")


def _pin_initial(archive: Path) -> str:
    """The label of the pinned initial snapshot: the pipeline's, or LABEL pinned here (manifest rewrite)."""
    path = archive / manifest_key(f"{SOURCE}/")
    m = loads(path.read_bytes())
    first = next(m.snapshots())
    pinned = pin_of(first)
    if pinned is not None and pinned.label:
        return pinned.label
    pin = Pin(label=LABEL, pinned_at=rfc3339(dt.datetime.now(dt.UTC)), origin=ORIGIN_INITIAL)
    path.write_bytes(replace(m, artifacts=tuple(with_pin(a, pin) if a is first else a for a in m.artifacts)).dumps())
    return LABEL


@pytest.fixture(scope="module")
def archived(pg_cluster: PgCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archived]:
    work = tmp_path_factory.mktemp("restore") / "work"
    work.mkdir()
    config, log = work / "snapshotter.conf", work / "runs.log"
    _write_config(config, pg_cluster.dsn(), work)
    rng = random.Random(20261124)
    conn = pg_cluster.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {SOURCE}; CREATE TABLE {SOURCE} ({_DEFINITION})")
            _insert(cur, [_row(rng, tenant, i) for tenant in ("acme", "umbrella") for i in range(1, 16)])
        _snapshot_source(conn, "oracle_initial")
        run_once(config, work, log)
        with conn.cursor() as cur:  # one transaction: updates (one key change), deletes, inserts
            cur.execute("BEGIN")
            cur.execute(f"UPDATE {SOURCE} SET big = 9007199254740993, amount = '1.10' WHERE id % 3 = 0")
            cur.execute(f"UPDATE {SOURCE} SET id = 100 WHERE tenant = 'acme' AND id = 1")
            cur.execute(f"DELETE FROM {SOURCE} WHERE id % 4 = 1 AND tenant = 'umbrella'")
            _insert(cur, [_row(rng, "initech", i) for i in range(1, 6)])
            cur.execute("COMMIT")
        _snapshot_source(conn, "oracle_mid")
        run_once(config, work, log)
        with conn.cursor() as cur:
            cur.execute(f"DELETE FROM {SOURCE} WHERE tenant = 'acme' AND id < 10")
            cur.execute(f"UPDATE {SOURCE} SET doc = '{{\"after\": 1}}', note = NULL WHERE tenant = 'initech'")
        _snapshot_source(conn, "oracle_last")
        run_once(config, work, log)
        label = _pin_initial(work / "archive")
        m = loads((work / "archive" / manifest_key(f"{SOURCE}/")).read_bytes())
        kinds = [a.kind for a in m.artifacts]
        assert kinds == ["snapshot", "diff", "diff"], kinds
        yield Archived(config, work / "archive", pg_cluster.dsn(), label, m.artifacts[0].to_position,
                       m.artifacts[1].to_position, m.artifacts[2].to_position)
    finally:
        stop_local_connect_server(work / ".snapshotter" / "spark-connect")
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {SOURCE}")
            cur.execute(f"SELECT pg_drop_replication_slot('{SOURCE}_slot') FROM pg_replication_slots "
                        f"WHERE slot_name = '{SOURCE}_slot'")
            cur.execute(f"DROP PUBLICATION IF EXISTS {SOURCE}_pub")
        conn.close()


# --- checks ----------------------------------------------------------------------------------------


def _one(conn: Any, query: str, *args: Any) -> Any:
    with conn.cursor() as cur:
        cur.execute(query, args)
        return cur.fetchone()[0]


def assert_restored(conn: Any, table: str, oracle: str) -> None:
    """`table` holds exactly `oracle`'s rows, with the source's column types and primary key."""
    cols = ", ".join(_COLUMNS)
    a, b = f"SELECT {cols} FROM {table}", f"SELECT {cols} FROM {oracle}"
    assert _one(conn, f"SELECT count(*) FROM {table}") == _one(conn, f"SELECT count(*) FROM {oracle}") > 0
    assert _one(conn, f"SELECT count(*) FROM (({a} EXCEPT ALL {b}) UNION ALL ({b} EXCEPT ALL {a})) d") == 0
    types = ("SELECT array_agg(attname || ' ' || format_type(atttypid, atttypmod) || ' ' || attnotnull "
             "ORDER BY attnum) FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped")
    assert _one(conn, types, table) == _one(conn, types, SOURCE)
    key = ("SELECT array_agg(a.attname ORDER BY k.i) FROM pg_index x CROSS JOIN unnest(x.indkey) WITH ORDINALITY "
           "k(attnum, i) JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum "
           "WHERE x.indrelid = %s::regclass AND x.indisprimary")
    assert _one(conn, key, table) == ["tenant", "id"]
    # the values the issue names, exactly (not only equal): bigint beyond 2^53, numeric digits, bytea bytes
    assert _one(conn, f"SELECT count(*) FROM {table} t JOIN {oracle} o USING (tenant, id) WHERE "
                      "t.big::text = o.big::text AND t.amount::text IS NOT DISTINCT FROM o.amount::text "
                      "AND t.blob IS NOT DISTINCT FROM o.blob AND t.doc::text IS NOT DISTINCT FROM o.doc::text"
                ) == _one(conn, f"SELECT count(*) FROM {oracle} WHERE big IS NOT NULL")


def staging_tables(conn: Any) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE '%\\_\\_restore\\_%'")
        return sorted(r[0] for r in cur.fetchall())


def _exists(conn: Any, table: str) -> bool:
    return bool(_one(conn, "SELECT to_regclass(%s) IS NOT NULL", table))


@pytest.fixture
def target_db(archived: Archived, pg_cluster: PgCluster) -> Iterator[Any]:
    conn = pg_cluster.connect()
    yield conn
    with conn.cursor() as cur:
        cur.execute("SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE 'r\\_%'")
        for (name,) in cur.fetchall():
            cur.execute(f'DROP TABLE "{name}"')
    assert staging_tables(conn) == []
    conn.close()


def _cli(archived: Archived, *args: str, capsys: pytest.CaptureFixture[str] | None = None) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main(["restore", "--config", str(archived.config), "--table", SOURCE, "--into", archived.dsn,
                     *args], out=out)
    err = capsys.readouterr().err if capsys is not None else ""
    return code, out.getvalue() + err


def _lsn_after(position: str, delta: int) -> str:
    value = parse_lsn(position)
    assert value is not None
    value += delta
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:08X}"


# --- the streamed path, through the command line -----------------------------------------------------


def test_restore_streams_the_pinned_snapshot_and_positions(archived: Archived, target_db: Any) -> None:
    code, out = _cli(archived, "--label", archived.label, "--target-table", "r_label")
    assert code == 0, out
    assert f"label {archived.label!r} ({archived.initial})" in out and "(stream)" in out
    assert_restored(target_db, "r_label", "oracle_initial")

    assert _cli(archived, "--at", archived.mid, "--target-table", "public.r_mid")[0] == 0
    assert_restored(target_db, "r_mid", "oracle_mid")
    # a position between two boundaries is the table at the last boundary before it
    code, out = _cli(archived, "--at", _lsn_after(archived.mid, 1), "--target-table", "r_between")
    assert code == 0 and f"at {archived.mid}:" in out, out
    assert_restored(target_db, "r_between", "oracle_mid")
    assert _cli(archived, "--at", archived.last, "--target-table", "r_last")[0] == 0
    assert_restored(target_db, "r_last", "oracle_last")


# --- the Spark path: the tasks COPY ------------------------------------------------------------------


def test_restore_through_spark_tasks(archived: Archived, target_db: Any, spark: Any) -> None:
    common: dict[str, Any] = {"into": archived.dsn, "stream_max_rows": 0, "spark": fixed_session(spark)}
    by_label = restore_table(archived.destination(), f"{SOURCE}/", label=archived.label, target_table="r_spark_label",
                             **common)
    assert (by_label.path, by_label.position, by_label.label) == ("spark", archived.initial, archived.label)
    assert_restored(target_db, "r_spark_label", "oracle_initial")
    at_mid = restore_table(archived.destination(), f"{SOURCE}/", position=archived.mid, target_table="r_spark_mid",
                           **common)
    assert (at_mid.path, at_mid.position, at_mid.rows) == ("spark", archived.mid,
                                                           _one(target_db, "SELECT count(*) FROM oracle_mid"))
    assert_restored(target_db, "r_spark_mid", "oracle_mid")


def test_the_command_line_restores_through_spark(archived: Archived, target_db: Any) -> None:
    """`snapshotter restore` as its own process, above the threshold: the configuration's Spark (the
    local Spark Connect server the runs started), whose tasks COPY."""
    command = [str(Path(sys.executable).with_name("snapshotter")), "restore", "--config", str(archived.config),
               "--table", SOURCE, "--into", archived.dsn, "--at", archived.last, "--target-table", "r_cli_spark",
               "--stream-max-rows", "0"]
    done = subprocess.run(command, cwd=archived.config.parent, env=e2e_env(), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"at {archived.last}:" in done.stdout and "(spark)" in done.stdout, done.stdout
    assert_restored(target_db, "r_cli_spark", "oracle_last")


# --- replace, atomicity, leftovers, concurrency -------------------------------------------------------


def test_replace_swaps_the_table_in_one_transaction(archived: Archived, target_db: Any) -> None:
    assert _cli(archived, "--label", archived.label, "--target-table", "r_swap")[0] == 0
    with pytest.raises(RestoreError, match=r"table public.r_swap exists in the target database.*--replace"):
        restore_table(archived.destination(), f"{SOURCE}/", into=archived.dsn, position=archived.last,
                      target_table="r_swap")
    assert_restored(target_db, "r_swap", "oracle_initial")  # untouched
    # a view on the old table: its DROP fails inside the swap transaction, so nothing changes
    with target_db.cursor() as cur:
        cur.execute("CREATE VIEW r_swap_view AS SELECT tenant, id FROM r_swap")
    with pytest.raises(RestoreError, match=r"cannot put the restored table in place of public\.r_swap: .*depend"):
        restore_table(archived.destination(), f"{SOURCE}/", into=archived.dsn, position=archived.last,
                      target_table="r_swap", replace=True)
    assert_restored(target_db, "r_swap", "oracle_initial")
    assert staging_tables(target_db) == []
    with target_db.cursor() as cur:
        cur.execute("DROP VIEW r_swap_view")
    result = restore_table(archived.destination(), f"{SOURCE}/", into=archived.dsn, position=archived.last,
                           target_table="r_swap", replace=True)
    assert result.replaced
    assert_restored(target_db, "r_swap", "oracle_last")
    assert staging_tables(target_db) == []


def _broken_copy(archived: Archived, tmp_path: Path, column: str, type_sql: str) -> LocalDestination:
    """A copy of the archive whose manifest declares `column` as `type_sql`."""
    copy = tmp_path / "archive"
    shutil.copytree(archived.archive, copy)
    path = copy / manifest_key(f"{SOURCE}/")
    m = loads(path.read_bytes())
    columns = [dict(c, Type=type_sql) if c["Name"] == column else c for c in m.columns]
    path.write_bytes(replace(m, columns=columns).dumps())
    return LocalDestination(copy)


@pytest.mark.parametrize("stream_max_rows", [1_000_000, 0], ids=["stream", "spark"])
def test_a_failure_midway_leaves_nothing_behind(archived: Archived, target_db: Any, spark: Any, tmp_path: Path,
                                                stream_max_rows: int) -> None:
    # `big` declared smallint: PostgreSQL refuses the first value beyond it, after earlier rows were copied
    broken = _broken_copy(archived, tmp_path, "big", "smallint")
    kw: dict[str, Any] = {"into": archived.dsn, "position": archived.last, "stream_max_rows": stream_max_rows,
                          "spark": fixed_session(spark)}
    with pytest.raises(RestoreError, match="out of range for type smallint"):
        restore_table(broken, f"{SOURCE}/", target_table="r_failed", **kw)
    assert not _exists(target_db, "r_failed") and staging_tables(target_db) == []
    # with --replace, the old table stays as it was
    restore_table(archived.destination(), f"{SOURCE}/", into=archived.dsn, label=archived.label, target_table="r_kept")
    with pytest.raises(RestoreError, match="out of range for type smallint"):
        restore_table(broken, f"{SOURCE}/", target_table="r_kept", replace=True, **kw)
    assert_restored(target_db, "r_kept", "oracle_initial")
    assert staging_tables(target_db) == []


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def test_a_restore_killed_before_its_swap_changes_nothing(archived: Archived, target_db: Any,
                                                          pg_cluster: PgCluster) -> None:
    """kill -9 of `snapshotter restore --replace` while its swap waits for the old table: the old table
    stays, the staging table is left behind, and the next restore of the target drops it."""
    restore_table(archived.destination(), f"{SOURCE}/", into=archived.dsn, label=archived.label, target_table="r_crash")
    holder = pg_cluster.connect()
    holder.autocommit = False
    holder.cursor().execute("LOCK TABLE r_crash IN ACCESS EXCLUSIVE MODE")  # the swap's DROP waits for it
    command = [str(Path(sys.executable).with_name("snapshotter")), "restore", "--config", str(archived.config),
               "--table", SOURCE, "--into", archived.dsn, "--at", archived.last, "--target-table", "r_crash",
               "--replace"]
    proc = subprocess.Popen(command, env=e2e_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait(lambda: proc.poll() is not None or _one(
            target_db, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
            "DROP TABLE %r_crash%") == 1, "the restore's swap to wait for the lock")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        (leftover,) = staging_tables(target_db)  # loaded in full, not yet swapped
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        holder.rollback()
        holder.close()
    _wait(lambda: _one(target_db, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s",
                       0x5E570) == 0, "the killed restore's session to end")
    assert_restored(target_db, "r_crash", "oracle_initial")  # the old table, untouched
    assert staging_tables(target_db) == [leftover]
    result: RestoreResult = restore_table(archived.destination(), f"{SOURCE}/", into=archived.dsn,
                                          position=archived.mid, target_table="r_crash", replace=True)
    assert result.cleaned == (f"public.{leftover}",)
    assert staging_tables(target_db) == []
    assert_restored(target_db, "r_crash", "oracle_mid")


def test_a_second_restore_of_the_same_target_is_refused(archived: Archived, target_db: Any) -> None:
    with (Target(archived.dsn, TableName("public", "r_busy")),
          pytest.raises(RestoreError, match=r"another restore of public\.r_busy is running")):
        restore_table(archived.destination(), f"{SOURCE}/", into=archived.dsn, label=archived.label,
                      target_table="r_busy")
    assert not _exists(target_db, "r_busy")


# --- bad input: one clear line, exit status 1, nothing written ----------------------------------------


def test_bad_input_is_named(archived: Archived, target_db: Any, pg_cluster: PgCluster, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (["--label", "nope", "--target-table", "r_bad"],
         f"has no snapshot labelled 'nope'; labels: {archived.label}"),
        (["--at", "0/1", "--target-table", "r_bad"],
         f"cannot restore position 0/1: its first snapshot is at {archived.initial}"),
        (["--at", "yesterday", "--target-table", "r_bad"], "'yesterday' is not a PostgreSQL LSN"),
        (["--at", archived.mid, "--target-table", "oracle_mid"],
         "table public.oracle_mid exists in the target database: restore into another --target-table, or pass "
         "--replace"),
        (["--at", archived.mid, "--target-table", "nowhere.r_bad"], "schema 'nowhere' does not exist"),
        (["--at", archived.mid, "--target-table", "a.b.c" + "x" * 70], "is not a table name"),
    ]
    for args, message in cases:
        code, out = _cli(archived, *args, capsys=capsys)
        assert code == 1 and message in out, (args, out)
    wrong_password = pg_cluster.dsn(password="not-the-password")
    for dsn, message in (("host=127.0.0.1 port=notaport =oops", "not a valid libpq connection string"),
                         (wrong_password, "cannot connect to the target database: "),
                         (pg_cluster.dsn(port=1), "cannot connect to the target database: ")):
        code = cli.main(["restore", "--config", str(archived.config), "--table", SOURCE, "--into", dsn,
                         "--label", archived.label, "--target-table", "r_bad"], out=io.StringIO())
        err = capsys.readouterr().err
        assert code == 1 and message in err and "not-the-password" not in err, err
    code = cli.main(["restore", "--config", str(archived.config), "--table", "public.missing", "--into",
                     archived.dsn, "--label", archived.label], out=io.StringIO())
    assert code == 1 and "no table 'public.missing'" in capsys.readouterr().err
    # a type the target database does not know is named before anything is created
    unknown = _broken_copy(archived, tmp_path, "doc", "mood_that_is_not_there")
    with pytest.raises(RestoreError, match="column 'doc' has type 'mood_that_is_not_there'"):
        restore_table(unknown, f"{SOURCE}/", into=archived.dsn, label=archived.label, target_table="r_bad")
    assert not _exists(target_db, "r_bad") and staging_tables(target_db) == []


# --- the Dagster job ---------------------------------------------------------------------------------


def test_the_restore_job_writes_the_table_from_its_run_config(archived: Archived, target_db: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from snapshot_assets.definitions import resources
    from snapshot_assets.jobs import restore

    monkeypatch.setenv("SNAPSHOTTER_CONFIG", str(archived.config))
    monkeypatch.setenv("RESTORE_TARGET_DSN", archived.dsn)
    tables.config.cache_clear()
    tables.pipeline.cache_clear()
    try:
        defs = dg.Definitions(jobs=[restore], resources=resources())
        op_config = {"table": SOURCE, "position": archived.mid, "into": {"env": "RESTORE_TARGET_DSN"},
                     "target_table": "r_job"}
        result = defs.resolve_job_def("restore").execute_in_process(
            run_config={"ops": {"restore_into_postgres": {"config": op_config}}, "resources": {"s3": {"config": {}}}},
            instance=dg.DagsterInstance.ephemeral())
        assert result.success
        (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        metadata = {k: v.value for k, v in output.event_specific_data.metadata.items()}  # type: ignore[union-attr]
        assert metadata["position"] == archived.mid and metadata["target"] == "public.r_job"
        assert_restored(target_db, "r_job", "oracle_mid")
        failed = defs.resolve_job_def("restore").execute_in_process(
            run_config={"ops": {"restore_into_postgres": {"config": {**op_config, "position": "",
                                                                      "label": "nope"}}},
                        "resources": {"s3": {"config": {}}}},
            instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
        assert not failed.success
        assert "has no snapshot labelled 'nope'" in str(failed.failure_data_for_node("restore_into_postgres"))
    finally:
        tables.config.cache_clear()
        tables.pipeline.cache_clear()
