"""Two ingest processes for one table on two "hosts" that share only S3: one writes, the other waits.

Each `snapshotter ingest` runs with its own working directory and TMPDIR, and the config names
only S3 locations on moto_server (the working root `buffer.path = "s3://..."`; the archive): no
local path is shared, so neither can see the other's kernel locks. The writer role is the lease
object in S3. The first process wins and streams a live PostgreSQL table (REPLICA IDENTITY
DEFAULT, snowflake-sized bigint keys, large text values); the second stands by. Then the winner is
killed with SIGKILL mid-workload; the stand-by takes over within the lease time and carries on.
The oracle: the buffer, replayed, equals the table at the buffer's durable position, with no seq
repeated or missing (nothing lost, nothing duplicated across the takeover).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resources.buffer import BufferReader
from resources.buffer.object_storage import ObjectStorage
from resources.work_storage import WorkRoot
from snapshot_assets.archive.positions import compare_lsn
from tests.buffer.helpers import buffer_rows, replay
from tests.e2e.conftest import e2e_env
from tests.pg.conftest import PgCluster

pytestmark = pytest.mark.slow

TABLE = "takeover_t"
QUALIFIED = f"public.{TABLE}"
LEASE_S = 4
BASE_ID = 2**60  # snowflake-sized: beyond 2^53


def write_config(path: Path, dsn: str, bucket: str, moto: str) -> None:
    s3 = f'{{ endpoint_url = "{moto}", path_style = true }}'
    path.write_text(f"""
snapshotter {{
  source {{ type = postgres, dsn = "{dsn}", schema = public, table = {TABLE}, slot = {TABLE}_slot,
            publication = {TABLE}_pub }}
  destinations = [ {{ type = s3, bucket = {bucket}, prefix = "archive/", endpoint_url = "{moto}", path_style = true }} ]
  buffer {{ path = "s3://{bucket}/work", lease = {LEASE_S}s, seal_interval = 100ms, s3 = {s3} }}
}}
""")


def start_host(name: str, config: Path, base: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`snapshotter ingest` as if on its own host: its own cwd and TMPDIR, nothing else shared."""
    home = base / name
    (home / "tmp").mkdir(parents=True)
    log = home / "ingest.log"
    command = [str(Path(sys.executable).with_name("snapshotter")), "ingest", "--config", str(config)]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=home, env=e2e_env(TMPDIR=str(home / "tmp")), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def storage(bucket: str, moto: str) -> ObjectStorage:
    return ObjectStorage(WorkRoot.open(f"s3://{bucket}/work", {"endpoint_url": moto, "path_style": True})
                         .part(QUALIFIED))


def wait_for(what: str, check: Any, timeout: float, *logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                              for log in logs)
            pytest.fail(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.2)


def workload(pg: PgCluster, rng: random.Random, transactions: int) -> Iterator[str]:
    """Random inserts/updates/deletes in single transactions; yields each commit's WAL insert position."""
    conn = pg.connect()
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            for _ in range(transactions):
                for _ in range(rng.randint(1, 4)):
                    key = BASE_ID + rng.randrange(200)
                    op = rng.random()
                    if op < 0.5:
                        cur.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
                                    "SET n = EXCLUDED.n", (key, rng.randrange(10**6), rng.randbytes(3000).hex()))
                    elif op < 0.85:
                        cur.execute(f"UPDATE {TABLE} SET n = n + 1 WHERE id = %s", (key,))  # big text unchanged
                    else:
                        cur.execute(f"DELETE FROM {TABLE} WHERE id = %s", (key,))
                cur.execute("SELECT pg_current_wal_insert_lsn()::text")
                position = cur.fetchone()[0]
                conn.commit()
                yield position
                time.sleep(rng.uniform(0, 0.01))
    finally:
        conn.close()


def table_now(pg: PgCluster) -> list[dict[str, Any]]:
    with pg.connect() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, n, big FROM {TABLE} ORDER BY id")
        return [{"id": r[0], "n": r[1], "big": r[2]} for r in cur.fetchall()]


def test_one_ingest_wins_the_other_waits_and_takes_over_after_kill9(
        pg_cluster: PgCluster, s3_bucket: str, moto_server: str, tmp_path: Path) -> None:
    with pg_cluster.connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, n bigint, big text)")
        cur.execute(f"INSERT INTO {TABLE} SELECT {BASE_ID} + g, g, repeat(md5(g::text), 150) "
                    "FROM generate_series(0, 99) g")
    config = tmp_path / "snapshotter.conf"  # each "host" has its copy of the same file
    write_config(config, pg_cluster.dsn(), s3_bucket, moto_server)
    store = storage(s3_bucket, moto_server)
    reader = BufferReader("", QUALIFIED, storage=store)
    rng = random.Random(20261124)

    first, first_log = start_host("host-a", config, tmp_path)
    wait_for("the first ingest to load the table", lambda: reader.durable_position() is not None, 90, first_log)
    second, second_log = start_host("host-b", config, tmp_path)
    try:
        wait_for("the second ingest to stand by", lambda: "standing by" in second_log.read_text(errors="replace"),
                 60, second_log)
        owner = store.writer_alive()
        assert owner is not None and f":{first.pid}:" in owner, owner
        positions = list(workload(pg_cluster, rng, 60))
        wait_for("the first ingest to seal the first half",
                 lambda: compare_lsn(reader.durable_position() or "0/0", positions[-1]) >= 0, 60, first_log)
        killed_at = reader.durable_position()
        tail = workload(pg_cluster, rng, 60)
        positions += [next(tail) for _ in range(10)]
        os.killpg(first.pid, signal.SIGKILL)  # mid-workload, lease still valid: the successor must wait it out
        first.wait()
        killed = time.monotonic()
        positions += list(tail)
        wait_for("the stand-by to take over", lambda: (store.writer_alive() or "").find(f":{second.pid}:") >= 0,
                 LEASE_S + 30, second_log)
        took = time.monotonic() - killed
        assert took <= LEASE_S + 10, f"takeover after {took:.1f}s, lease is {LEASE_S}s"
        wait_for("the stand-by to seal everything",
                 lambda: compare_lsn(reader.durable_position() or "0/0", positions[-1]) >= 0, 90, second_log)
        assert compare_lsn(reader.durable_position() or "0/0", killed_at or "0/0") > 0
        expected = table_now(pg_cluster)  # the workload is over: the table as of the durable position
        rows = buffer_rows("", QUALIFIED, store)  # read from S3 through the storage
        assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1)), "no seq lost or repeated"
        rebuilt = sorted((dict(row) for row in replay(rows, ("id",)).values()), key=lambda row: int(row["id"]))
        assert len(rebuilt) == len(expected) and rebuilt == expected
        assert not any(os.scandir(tmp_path / "host-b" / "tmp")), "segment spools are anonymous temp files"
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    assert json.loads(store.read("index.json") or b"{}"), "the index is in S3"
