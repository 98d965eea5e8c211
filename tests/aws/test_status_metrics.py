"""The operational surface: `snapshotter status`, the Prometheus exporter, asset metadata, health, alerts.

One archive on moto_server (a committed snapshot, changes pending in a real change buffer, an event
stuck in the outbox, a destination whose bucket is gone) is looked at through every surface; the
numbers must be the archive's own, and each surface must show the same ones.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from resources.buffer import ChangeBuffer
from resources.subscribers.events import TxEnd
from resources.subscribers.generator import GeneratorSubscriber
from snapshot_assets.archive.writer import ArtifactWriter
from snapshot_assets.cli import main
from snapshot_assets.counters import ARTIFACTS_WRITTEN, DESTINATION_ERRORS, EVENT_ERRORS
from snapshot_assets.http_api import serve
from snapshot_assets.metrics import StatusCollector, asset_metadata, samples
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.status import TableStatus, table_status
from tests.aws.support import TABLE, bucket, config, s3_dest

pytestmark = pytest.mark.s3


@dataclass
class Archive:
    good: TablePipeline  # the committing view: the good destination only
    watched: TablePipeline  # the configured view: good + a destination whose bucket does not exist
    config_file: Path
    head: str
    durable: str
    pending: int
    missing: str
    sink: str


def _buffer(root: Path) -> tuple[GeneratorSubscriber, list[str]]:
    gen = GeneratorSubscriber(TABLE, seed=7, rows=30, changes=80)
    boundaries = []
    with ChangeBuffer(root, TABLE, seal_interval=3600.0, seal_changes=25) as buffer:
        for event in gen.events(None):
            buffer.append(event)
            if isinstance(event, TxEnd):
                boundaries.append(event.position)
        buffer.seal()
    return gen, boundaries


@pytest.fixture(scope="module")
def archive(moto_server: str, tmp_path_factory: pytest.TempPathFactory) -> Archive:
    tmp = tmp_path_factory.mktemp("status")
    good, missing = s3_dest(bucket(moto_server), moto_server), s3_dest("gone-" + "x" * 10, moto_server)
    queue = json.dumps({"type": "sqs", "queue_url": f"{moto_server}/123456789012/absent", "endpoint_url": moto_server,
                        "region": "us-east-1"})
    committing = TablePipeline(config(tmp, [good], events=[queue]).tables[0])
    gen, boundaries = _buffer(Path(committing.cfg.buffer.path))
    head = boundaries[len(boundaries) // 2]
    writer = ArtifactWriter(committing.destinations, committing.cfg.key_prefix)
    committing.commit(writer.write_snapshot(1, head, gen.table_at(head).values()))
    text = (f"snapshotter {{ source {{ type = generator, table = users }}, destinations = [{good}, {missing}], "
            f"events = [{queue}], buffer.path = {json.dumps(str(tmp / 'buffer'))} }}")
    (tmp / "snapshotter.conf").write_text(text)
    watched = TablePipeline(config(tmp, [good, missing], events=[queue]).tables[0])
    pending = committing.buffer().stats(head).changes
    return Archive(committing, watched, tmp / "snapshotter.conf", head, boundaries[-1], pending,
                   f"s3://{json.loads(missing)['bucket']}/archive/", committing.sinks[0].name)


def _status(archive: Archive) -> TableStatus:
    return table_status(archive.watched)


def test_status_reports_the_archive_buffer_trigger_outbox_and_each_destination(archive: Archive) -> None:
    s = _status(archive)
    assert (s.epoch, s.head_position, s.artifacts) == (1, archive.head, 1)
    assert s.durable_position == archive.durable and s.buffered_changes == archive.pending > 0
    assert s.source_position == archive.durable and s.source_position_from == "buffer" and s.source_lag == 0
    assert s.churn_since_snapshot == archive.pending and 0 <= (s.snapshot_age_s or -1) < 600
    assert s.decision == f"diff (diff_interval) to {archive.durable}"
    assert s.outbox_depth == 1
    good, missing = s.destinations
    assert good.ok and "revision" in good.detail
    assert not missing.ok and missing.destination == archive.missing and "NoSuchBucket" in missing.detail
    assert s.counters[ARTIFACTS_WRITTEN] == {"snapshot": 1} and s.counters[EVENT_ERRORS] == {archive.sink: 1}
    assert s.counters[DESTINATION_ERRORS][archive.missing] >= 1


def test_ready_once_snapshotted_and_the_ingest_holds_the_buffer(archive: Archive) -> None:
    s = _status(archive)
    assert not s.ready and not s.ingest_alive
    assert s.not_ready == ["ingest is not running: no process holds the buffer writer lock"]
    with ChangeBuffer(archive.good.cfg.buffer.path, TABLE):  # what the ingest run / `snapshotter ingest` hold
        alive = _status(archive)
    assert alive.ready and alive.ingest_alive and alive.ingest.startswith("pid ")


def test_a_table_never_ingested_is_not_ready_and_looking_creates_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "snapshotter.conf"
    cfg.write_text(f"snapshotter {{ source {{ type = generator, table = users }}, buffer.path = "
                   f"{json.dumps(str(tmp_path / 'buffer'))}, destinations = [{{ type = local, "
                   f"path = {json.dumps(str(tmp_path / 'archive'))} }}] }}")
    out = io.StringIO()
    assert main(["status", "--config", str(cfg), "--output", "json"], out=out) == 0
    (doc,) = json.loads(out.getvalue())["tables"]
    assert not doc["ready"] and doc["not_ready"][0] == "no snapshot committed yet"
    assert doc["errors"] == ["the change buffer does not exist yet (nothing ingested)"]
    assert not (tmp_path / "buffer" / TABLE).exists()


def test_status_cli_json_and_table(archive: Archive) -> None:
    out = io.StringIO()
    assert main(["status", "--config", str(archive.config_file), "--output", "json"], out=out) == 0
    (doc,) = json.loads(out.getvalue())["tables"]
    assert doc["table"] == TABLE and doc["epoch"] == 1 and doc["outbox_depth"] == 1
    assert [d["ok"] for d in doc["destinations"]] == [True, False]
    text = io.StringIO()
    assert main(["status", "--config", str(archive.config_file)], out=text) == 0
    assert text.getvalue().startswith(f"{TABLE}  NOT READY: ingest is not running")
    assert f"destination    {archive.missing} ERROR: " in text.getvalue()


def test_metrics_and_asset_metadata_carry_the_same_numbers(archive: Archive) -> None:
    status = _status(archive)
    collector = StatusCollector(lambda: [status])
    collector.refresh()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    table = f'table="{TABLE}"'  # the exposition sorts labels by name
    for line in (f"snapshotter_epoch{{{table}}} 1.0",
                 f"snapshotter_buffer_depth{{{table}}} {float(archive.pending)}",
                 f'snapshotter_artifacts_written_total{{kind="snapshot",{table}}} 1.0',
                 f'snapshotter_artifacts_written_total{{kind="diff",{table}}} 0.0',
                 f'snapshotter_event_errors_total{{sink="{archive.sink}",{table}}} 1.0',
                 f"snapshotter_manifest_cas_retries_total{{{table}}} 0.0",
                 f'snapshotter_destination_up{{dest="{archive.missing}",{table}}} 0.0',
                 f"snapshotter_source_lag{{{table}}} 0.0",
                 f"snapshotter_ready{{{table}}} 0.0"):
        assert line in text.splitlines(), line
    for name in ("diff_bytes", "churn_records", "snapshot_age_seconds", "outbox_depth"):
        assert f"snapshotter_{name}{{{table}}}" in text
    assert f'snapshotter_destination_errors_total{{dest="{archive.missing}",{table}}}' in text
    metadata = asset_metadata(status)
    assert metadata["snapshotter_epoch"] == 1.0 and metadata["snapshotter_artifacts_written_total{kind=snapshot}"] == 1
    assert {s.key() for s in samples(status)} == set(metadata)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_exporter_serves_over_http(archive: Archive) -> None:
    port, stop = _free_port(), threading.Event()
    thread = threading.Thread(target=serve, args=(lambda: [_status(archive)],),
                              kwargs={"tables": [TABLE], "port": port, "addr": "127.0.0.1", "interval": 60.0,
                                      "stop": stop})
    thread.start()
    try:
        # The first collection runs in the background (a slow destination must not delay the liveness
        # probe), so the first answers may precede it: poll until it is in, with a deadline.
        body, want, deadline = "", f'snapshotter_epoch{{table="{TABLE}"}} 1.0', time.monotonic() + 30
        while want not in body and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    body = response.read().decode()
            except OSError:
                pass
            stop.wait(0.1)
        assert want in body
        assert "snapshotter_status_collected_timestamp_seconds" in body
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SNAPSHOTTER_ALERT_WEBHOOK", f"http://127.0.0.1:{server.server_address[1]}/hook")
    yield received
    server.shutdown()


def test_the_run_failure_sensor_alerts_through_its_hooks(webhook: list[dict[str, Any]]) -> None:
    from sensors.run_failure import run_failure_alert

    @dg.op
    def upload() -> None:
        raise dg.Failure("s3 put failed for bucket 'b': endpoint unreachable")

    @dg.job(name="snapshot_job")
    def failing() -> None:
        upload()

    instance = dg.DagsterInstance.ephemeral()
    result = failing.execute_in_process(instance=instance, raise_on_error=False, tags={"dagster/partition": TABLE})
    failure = result.get_run_failure_event()
    context = dg.build_run_status_sensor_context(sensor_name="run_failure_alert", dagster_instance=instance,
                                                 dagster_run=result.dagster_run, dagster_event=failure)
    run_failure_alert(context.for_run_failure())
    (alert,) = webhook
    assert (alert["job"], alert["table"], alert["run_id"]) == ("snapshot_job", TABLE, result.run_id)
    assert alert["text"].startswith(f"snapshotter: snapshot_job for {TABLE} failed")
