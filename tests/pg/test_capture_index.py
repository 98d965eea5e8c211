"""The capture page index in PostgreSQL (the private test cluster): records of every page, replay
through them, reconciliation after deleting rows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from resources.capture.app import CaptureApp
from resources.capture.index import ObjectIndex, SqlIndex
from resources.capture.reconcile import reconcile
from resources.capture.replay import replay
from resources.capture.settings import IndexSettings
from resources.destinations.local import LocalDestination
from tests.capture.conftest import Running, settings_for


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    import psycopg2

    name = "capture_pages_test"
    yield name
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}")
    conn.close()


def test_postgres_index_replay_and_reconciliation(tmp_path: Path, pg_dsn: str, table: str) -> None:
    settings = replace(settings_for(tmp_path, max_events=4),
                       index=IndexSettings(backend="postgres", dsn=pg_dsn, table=table, retry_backoff=0.1))
    app = CaptureApp(settings)
    running = Running(app, app.start(0, host="127.0.0.1"))
    sent = [f"event {i}".encode() for i in range(10)]
    for payload in sent:
        running.publish("pg-writer", payload)
    running.stop()
    sql = SqlIndex(settings.index)
    rows = sql.pages("pg-writer", None, None)
    assert [(r["page_sequence"], r["event_count"]) for r in rows] == [(0, 4), (4, 4), (8, 2)]
    assert [e.payload for e in replay(settings, "pg-writer")] == sent

    for row in rows[:2]:
        sql.delete(row["page_key"])
    dest = LocalDestination(str(tmp_path / "pages"))
    result = reconcile(dest, [ObjectIndex(dest), sql], settings.storage.key_template)
    assert result.missing == (("ObjectIndex", 0), ("SqlIndex", 2))
    assert sql.pages("pg-writer", None, None) == rows
