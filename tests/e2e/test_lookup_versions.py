"""get(key) on a live PostgreSQL table archived by `snapshotter run --once`: each key's version is the
commit position of its last change and its commit time is the one PostgreSQL recorded.

The oracle. Every transaction of the test reads `pg_current_wal_insert_lsn()` as its last statement
(B, before the commit record) and, after COMMIT, `pg_current_wal_lsn()` (A) and the commit time
PostgreSQL recorded for its xid (`pg_xact_commit_timestamp`, the cluster runs with
`track_commit_timestamp = on`). With one writer the commit record starts in [B, A], and the commit
time pgoutput reports is the recorded one, to the microsecond.

The archive: the initial snapshot, a diff, a forced re-base, another diff, so versions come from a
snapshot's versions object (the copy's, and changes before the re-base) and from diffs' (changes
after it), across an incremental re-base that copied untouched buckets. The table is as users have
it: REPLICA IDENTITY DEFAULT, bigint keys beyond 2^53, text and jsonb values.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from resources.destinations.local import LocalDestination
from snapshot_assets.archive import gojson
from snapshot_assets.archive.positions import parse_lsn
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.cli import main
from tests.e2e.conftest import e2e_env
from tests.e2e.test_postgres_rounds import RUN_TIMEOUT_S, drop_archived_table
from tests.pg.conftest import PgCluster

pytestmark = pytest.mark.slow

TABLE = "versions_src"
BIG = 2**60


@dataclass(frozen=True)
class Committed:
    """One transaction as PostgreSQL saw it: its commit record starts in [before, after]."""

    before: int
    after: int
    commit_time: str  # Go's RFC 3339 of the recorded commit time

    def holds(self, position: str | None) -> bool:
        lsn = parse_lsn(position or "")
        return lsn is not None and self.before <= lsn <= self.after


def _transaction(conn: Any, *statements: str) -> Committed:
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        for statement in statements:
            cur.execute(statement)
        cur.execute("SELECT txid_current(), pg_current_wal_insert_lsn()")
        xid, before = cur.fetchone()
        cur.execute("COMMIT")
        cur.execute("SELECT pg_current_wal_lsn(), pg_xact_commit_timestamp(%s::text::xid)", (xid,))
        after, committed = cur.fetchone()
    assert committed is not None, "the cluster must run with track_commit_timestamp = on"
    return Committed(parse_lsn(before) or 0, parse_lsn(after) or 0, gojson.time_text(committed))


def _run(config: Path, work: Path, *extra: str) -> None:
    command = [str(Path(sys.executable).with_name("snapshotter")), "run", "--once", "--config", str(config), *extra]
    done = subprocess.run(command, cwd=work, env=e2e_env(), capture_output=True, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]


def _get(archive: Path, key: int, at: str | None = None) -> dict[str, Any]:
    out = io.StringIO()
    args = ["get", "--path", str(archive), "--table", f"public.{TABLE}", "--key", str(key)]
    assert main([*args, *(["--at", at] if at else [])], out=out) == 0
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def _head(archive: Path) -> str:
    return ArchiveReader(LocalDestination(archive), f"{TABLE}/").load_manifest().head_position


def test_versions_are_the_commit_positions_and_times_postgres_recorded(pg_cluster: PgCluster, workdir: Path) -> None:
    conn = pg_cluster.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {TABLE}")
            cur.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, note text, doc jsonb)")
            # about 33 MiB of jsonl: four buckets of 8 MiB, so the re-base copies the ones no change touched
            cur.execute(f"INSERT INTO {TABLE} SELECT {BIG} + g, repeat(md5(g::text), 128), "
                        "jsonb_build_object('g', g) FROM generate_series(0, 7999) g")
        config = workdir / "snapshotter.conf"
        config.write_text(f"""
snapshotter {{
  source {{ type = postgres, dsn = "{pg_cluster.dsn()}", schema = public, table = {TABLE},
           slot = {TABLE}_slot, publication = {TABLE}_pub }}
  diff.interval = 1s
  snapshot {{ min_interval = 0s, max_churn_records = 0 }}
  state {{ bucket_size = 8MiB }}
  destinations = [ {{ type = local, path = "{workdir / 'archive'}" }} ]
  formats {{ snapshot = [jsonl, protobuf], diff = [jsonl] }}
  buffer {{ path = "{workdir / 'buffer'}", seal_interval = 200ms }}
}}
""")
        archive = workdir / "archive"
        _run(config, workdir)
        initial = _head(archive)

        def update(i: int, text: str) -> Committed:
            return _transaction(conn, f"UPDATE {TABLE} SET note = '{text}', doc = '{{\"v\": \"{text}\"}}' "
                                      f"WHERE id = {BIG + i}")

        first = update(10, "one")
        deleted = _transaction(conn, f"DELETE FROM {TABLE} WHERE id = {BIG + 20}")
        update(30, "two-a")
        twice = update(30, "two-b")  # the later of two changes in one diff's window
        inserted = _transaction(conn, f"INSERT INTO {TABLE} VALUES ({BIG + 9000}, 'new', '{{}}')")
        _run(config, workdir)
        diff_end = _head(archive)
        before_rebase = update(7990, "three")  # in the last bucket: the middle ones are copied by the re-base
        _run(config, workdir, "--force-snapshot")
        rebased = _head(archive)
        again = update(10, "four")
        _run(config, workdir)
        head = _head(archive)
        assert len({initial, diff_end, rebased, head}) == 4

        untouched = _get(archive, BIG + 3)
        assert untouched["found"] and untouched["version"] == initial and untouched["copied"]
        assert untouched["commit_time"] is None
        at_head = _get(archive, BIG + 10)  # changed after the re-base: the last diff's versions object
        assert at_head["row"]["note"] == "four" and again.holds(at_head["version"])
        assert at_head["commit_time"] == again.commit_time and "copied" not in at_head
        from_snapshot = _get(archive, BIG + 10, rebased)  # changed before it: the snapshot's versions object
        assert from_snapshot["row"]["note"] == "one" and first.holds(from_snapshot["version"])
        assert from_snapshot["commit_time"] == first.commit_time and from_snapshot["unchanged_since"] == rebased
        in_diff = _get(archive, BIG + 10, diff_end)  # the same change, read from the first diff's object
        assert first.holds(in_diff["version"]) and in_diff["commit_time"] == first.commit_time
        assert in_diff["changed_after"] == initial
        latest = _get(archive, BIG + 30)
        assert latest["row"]["note"] == "two-b" and twice.holds(latest["version"])
        assert latest["commit_time"] == twice.commit_time
        gone = _get(archive, BIG + 20, diff_end)  # the diff that holds the delete
        assert not gone["found"] and deleted.holds(gone["deleted_at"]) and gone["deleted_at"] == gone["version"]
        assert gone["commit_time"] == deleted.commit_time
        # a snapshot holds no deletions: after the re-base the key is just not there
        after = _get(archive, BIG + 20)
        assert not after["found"] and "version" not in after and "deleted_at" not in after
        new = _get(archive, BIG + 9000)
        assert new["found"] and inserted.holds(new["version"]) and new["commit_time"] == inserted.commit_time
        rebased_row = _get(archive, BIG + 7990)
        assert before_rebase.holds(rebased_row["version"]) and rebased_row["commit_time"] == before_rebase.commit_time
        before_it = _get(archive, BIG + 7990, diff_end)  # as of before its change: still the copy's
        assert before_it["version"] == initial and before_it["copied"]
        middle = _get(archive, BIG + 4000)  # a row of a bucket the re-base copied: its version was copied too
        assert middle["version"] == initial and middle["copied"] and middle["unchanged_since"] == rebased
    finally:
        drop_archived_table(conn, TABLE)
