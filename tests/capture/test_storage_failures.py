"""Storage outages against a real S3 endpoint (moto_server frozen with SIGSTOP, then thawed): pages
wait and retry, nothing is lost; when retries run out the page goes to the dead-letter directory
and the alert metric and /health/storage say so."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest

from resources.aws_credentials import CredentialProfiles
from resources.capture.app import CaptureApp
from resources.capture.pages import decode
from resources.capture.replay import replay
from resources.capture.settings import CaptureSettings
from snapshot_assets.config import load_config
from tests.aws.conftest import Moto, start_moto
from tests.capture.conftest import Running, counter, settings_for, wait_for

Serve = Callable[[CaptureSettings], Running]


@pytest.fixture
def moto(tmp_path: Path, aws_test_credentials: None) -> Iterator[Moto]:
    server = start_moto(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def _s3(moto: Moto) -> dict[str, Any]:
    boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1").create_bucket(Bucket="events")
    return {"type": "s3", "bucket": "events", "prefix": "capture/", "endpoint_url": moto.url, "path_style": True,
            "region": "us-east-1", "connect_timeout": 1.0, "read_timeout": 1.0, "max_attempts": 1}


def _stored_keys(moto: Moto, prefix: str = "capture/pages/") -> list[str]:
    client = boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1")
    listing = client.list_objects_v2(Bucket="events", Prefix=prefix)
    return [o["Key"] for o in listing.get("Contents", [])]


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.slow
def test_outage_then_recovery_loses_nothing(tmp_path: Path, moto: Moto, serve: Serve) -> None:
    settings = settings_for(tmp_path, destination=_s3(moto), max_events=2)
    settings = replace(settings, storage=replace(settings.storage, retry_backoff=0.2, retry_for=120.0))
    running = serve(settings)
    running.publish("w", b"0")
    running.publish("w", b"1")
    wait_for(lambda: len(_stored_keys(moto)) == 1, what="the first page")
    moto.freeze()
    try:
        for i in range(2, 8):  # acknowledged while storage is down: durability does not wait for S3
            assert running.publish("w", str(i).encode()).sequence == i
        wait_for(lambda: counter(running.app, "storage_errors") >= 2, what="failed writes being retried")
    finally:
        moto.thaw()
    wait_for(lambda: len(_stored_keys(moto)) == 4, timeout=60, what="the held pages after the outage")
    running.stop()
    assert [e.payload for e in replay(settings, "w")] == [str(i).encode() for i in range(8)]
    assert counter(running.app, "capture_dead_letter_pages") == 0


@pytest.mark.slow
def test_retries_exhausted_go_to_dead_letter_with_an_alert(tmp_path: Path, moto: Moto) -> None:
    settings = settings_for(tmp_path, destination=_s3(moto), max_events=3)
    settings = replace(settings, storage=replace(settings.storage, retry_backoff=0.1, retry_for=1.5))
    app = CaptureApp(settings)
    port = app.start(0, http_port=0, host="127.0.0.1")
    running = Running(app, port)
    try:
        moto.freeze()
        for i in range(3):
            running.publish("dl", f"lost-{i}".encode())
        dead = tmp_path / "buffer" / "dead-letter"
        records = wait_for(lambda: [p for p in dead.rglob("*.pb.gz.json") if not p.name.startswith(".")],
                           timeout=60, what="a dead-lettered page and its record")  # the record is written last
        page = [r.with_name(r.name.removesuffix(".json")) for r in records]
        assert [e.payload for e in decode(page[0].read_bytes()).events] == [b"lost-0", b"lost-1", b"lost-2"]
        record = json.loads(page[0].with_name(page[0].name + ".json").read_text())
        assert (record["writer_id"], record["event_count"]) == ("dl", 3)
        wait_for(lambda: counter(app, "capture_dead_letter_pages") == 1,
                 what="the alert metric")
        status, body = _get(f"http://127.0.0.1:{app.http_port_bound}/health/storage")
        assert status == 503 and body["dead_letter_pages"] == 1 and body["status"] == "unhealthy"
        with urllib.request.urlopen(f"http://127.0.0.1:{app.http_port_bound}/metrics", timeout=10) as r:
            assert "snapshotter_capture_dead_letter_pages_total 1.0" in r.read().decode()
    finally:
        moto.thaw()
        running.stop()
    assert not (tmp_path / "buffer" / "writers" / "dl" / "seg-00000000000000000000.log").exists()


def test_s3_destination_signed_as_a_configured_profile(tmp_path: Path, moto: Moto) -> None:
    _s3(moto)  # creates the bucket
    config = tmp_path / "capture.conf"
    config.write_text(f"""snapshotter {{
  credentials {{ writer {{ type = ambient, region = us-east-1 }} }}
  capture {{
    buffer {{ path = "{tmp_path}/buffer", max_events = 2 }}
    storage {{ destination {{ type = s3, bucket = events, prefix = "capture/", endpoint_url = "{moto.url}",
                             path_style = true, region = us-east-1, credentials = writer }} }}
  }}
}}""")
    loaded = load_config(config)
    assert loaded.capture is not None and loaded.capture.storage.destination["credentials"] == "writer"
    profiles = CredentialProfiles.shared(loaded.credentials)
    app = CaptureApp(loaded.capture, profiles=profiles)
    running = Running(app, app.start(0, host="127.0.0.1"))
    running.publish("p", b"one")
    running.publish("p", b"two")
    running.stop()
    assert len(_stored_keys(moto, prefix="capture/snapshots/")) == 1  # the default key template
    assert [e.payload for e in replay(loaded.capture, "p", profiles=profiles)] == [b"one", b"two"]


@pytest.mark.slow
def test_page_stored_but_not_marked_is_replaced_by_the_recovered_flush(tmp_path: Path, moto: Moto) -> None:
    """The window between a page reaching storage and the log being marked, reproduced on disk: the
    buffer directory is copied while the page's write is held by a frozen endpoint (events durable,
    no mark), the page is then stored and marked, and the server restarts from the copy, as after a
    kill -9 inside that window. The recovered flush writes the same key: one object, every event once,
    and sequences continue after the recovered ones."""
    settings = settings_for(tmp_path, destination=_s3(moto), max_events=5)
    settings = replace(settings, storage=replace(settings.storage, retry_backoff=0.2, retry_for=120.0))
    buffer = Path(settings.buffer.path)
    app = CaptureApp(settings)
    running = Running(app, app.start(0, host="127.0.0.1"))
    moto.freeze()
    try:
        for i in range(5):
            running.publish("k", str(i).encode())
        wait_for(lambda: counter(app, "storage_errors") >= 1, what="the page write to be held")
        shutil.copytree(buffer, tmp_path / "at-the-crash")
    finally:
        moto.thaw()
    wait_for(lambda: len(_stored_keys(moto)) == 1, what="the page")
    running.stop()
    [key] = _stored_keys(moto)
    shutil.rmtree(buffer)
    shutil.copytree(tmp_path / "at-the-crash", buffer)
    assert not (buffer / "writers" / "k" / "flushed.json").exists()  # the copy never heard of the page

    app = CaptureApp(settings)
    running = Running(app, app.start(0, host="127.0.0.1"))
    assert running.publish("k", b"5").sequence == 5
    running.stop()
    assert _stored_keys(moto) == [key, key.replace("00000000000000000000", "00000000000000000005")]
    assert [e.payload for e in replay(settings, "k")] == [str(i).encode() for i in range(6)]
