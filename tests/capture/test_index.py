"""The page index (SQLite table + object index): records for every page, replay through it, and
reconciliation restoring deleted records from storage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from resources.capture.index import ObjectIndex, SqlIndex
from resources.capture.reconcile import reconcile
from resources.capture.replay import replay
from resources.capture.settings import CaptureSettings, IndexSettings
from resources.destinations.local import LocalDestination
from tests.capture.conftest import Running, counter, settings_for, wait_for

Serve = Callable[[CaptureSettings], Running]


def with_index(settings: CaptureSettings, backend: str, dsn: str) -> CaptureSettings:
    return replace(settings, index=IndexSettings(backend=backend, dsn=dsn, retry_backoff=0.1))


def publish_pages(running: Running, writers: dict[str, int]) -> dict[str, list[bytes]]:
    sent: dict[str, list[bytes]] = {}
    for writer, count in writers.items():
        sent[writer] = [f"{writer}/{i}".encode() for i in range(count)]
        for payload in sent[writer]:
            running.publish(writer, payload)
    running.stop()
    return sent


def test_sqlite_index_replay_and_reconciliation(tmp_path: Path, serve: Serve) -> None:
    settings = with_index(settings_for(tmp_path, max_events=3), "sqlite", str(tmp_path / "index.db"))
    sent = publish_pages(serve(settings), {"a": 8, "b": 4})
    sql = SqlIndex(settings.index)
    rows = sql.pages("a", None, None)
    assert [(r["page_sequence"], r["last_sequence"], r["event_count"]) for r in rows] == [(0, 2, 3), (3, 5, 3),
                                                                                          (6, 7, 2)]
    assert {r["format"] for r in rows} == {"protobuf"} and {r["compression"] for r in rows} == {"gzip"}
    for writer, payloads in sent.items():
        assert [e.payload for e in replay(settings, writer)] == payloads

    dest = LocalDestination(str(tmp_path / "pages"))
    objects = ObjectIndex(dest)
    sql.delete(rows[1]["page_key"])
    objects.remove(rows[0]["page_key"], "a", rows[0]["start_time"])
    before = reconcile(dest, [objects, sql], settings.storage.key_template, restore=False)
    assert before.missing == (("ObjectIndex", 1), ("SqlIndex", 1)) and before.orphans == ()
    after = reconcile(dest, [objects, sql], settings.storage.key_template)
    assert after.missing == before.missing
    assert reconcile(dest, [objects, sql], settings.storage.key_template).missing == (("ObjectIndex", 0),
                                                                                     ("SqlIndex", 0))
    assert sql.pages("a", None, None) == rows
    assert [p["page_key"] for p in objects.pages("a", None, None)] == [r["page_key"] for r in rows]
    assert [e.payload for e in replay(settings, "a")] == sent["a"]


def test_index_outage_does_not_block_publishing(tmp_path: Path, serve: Serve) -> None:
    db = tmp_path / "index.db"
    settings = with_index(settings_for(tmp_path, max_events=2), "sqlite", str(db))
    running = serve(settings)
    db.rename(tmp_path / "index.db.away")
    db.mkdir()  # the database cannot be opened: every publish to it fails
    for i in range(4):
        running.publish("w", str(i).encode())  # acknowledged all the same: the index is off the durability path
    wait_for(lambda: running.app.index.pending() == 2 and counter(running.app, "index_publish_errors") >= 1,
             what="two queued records after failed publishes")
    db.rmdir()
    (tmp_path / "index.db.away").rename(db)  # back: the queue drains on its own
    wait_for(lambda: running.app.index.pending() == 0, what="the queue to drain")
    running.stop()
    assert [r["event_count"] for r in SqlIndex(settings.index).pages("w", None, None)] == [2, 2]
    assert [e.payload for e in replay(settings, "w")] == [b"0", b"1", b"2", b"3"]
