"""laredo's HTTP API (`snapshotter serve`) over real HTTP, on an archive written without Spark.

A real `snapshotter serve` process against a local archive and a real change buffer: readiness
goes 503 -> 200 once the first snapshot is committed and an ingest holds the buffer, the body
naming the table and why; `/status` carries laredo's field names and equals the manifest;
`/metrics` has the manifest head and the diffs since the snapshot with the manifest's values; the
error answers (unknown table, no Dagster instance, wrong method, unknown path) are specific; and
SIGTERM ends the process. Launching runs through a Dagster instance is in test_http_api_daemon.py.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from resources.buffer import ChangeBuffer
from snapshot_assets.archive.positions import parse_lsn
from snapshot_assets.config import load_config
from snapshot_assets.pipeline.table import TablePipeline
from tests.aws.support import diff, snapshot
from tests.e2e.conftest import e2e_env
from tests.e2e.http_support import call, metric, poll, serve_process

pytestmark = pytest.mark.slow

TABLE = "public.users"


def _config(work: Path) -> Path:
    path = work / "snapshotter.conf"
    path.write_text(f"""snapshotter {{
      source {{ type = generator, schema = public, table = users }}
      buffer.path = {json.dumps(str(work / 'buffer'))}
      destinations = [ {{ type = local, path = {json.dumps(str(work / 'archive'))} }} ]
      formats {{ snapshot = [jsonl], diff = [jsonl] }}
    }}""")
    return path


def test_health_status_metrics_and_errors_over_http(tmp_path: Path) -> None:
    config = _config(tmp_path)
    pipe = TablePipeline(load_config(config, env={}).tables[0])
    with serve_process(tmp_path, config, e2e_env()) as (port, process, log):
        live = call(port, "/health/live")
        assert (live.code, live.content_type, live.json()) == (200, "application/json", {"status": "ok"})

        # Not ready: no snapshot, no ingest; the body says which table and why.
        down = poll(lambda: a if (a := call(port, "/health/ready")).json()["tables"] else None, 30,
                    "a first status collection", log)
        assert down.code == 503
        (table,) = down.json()["tables"]
        assert down.json()["ready"] is False and (table["table"], table["ready"]) == (TABLE, False)
        no_snapshot, no_ingest = table["not_ready"]
        assert no_snapshot == "no snapshot committed yet" and no_ingest.startswith("ingest is not running: ")

        # A committed snapshot and two diffs, and an ingest holding the buffer: ready.
        snap = snapshot(pipe, "0/10")
        pipe.commit(snap)
        pipe.commit(diff(pipe, "0/10", "0/20"))
        last = diff(pipe, "0/20", "0/3A", ident=2)
        pipe.commit(last)
        with ChangeBuffer(pipe.cfg.buffer.path, TABLE):  # what `snapshotter ingest` / the ingest run hold
            up = poll(lambda: a if (a := call(port, "/health/ready")).code == 200 else None, 30, "readiness", log)
            assert up.json() == {"ready": True, "tables": [{"table": TABLE, "ready": True, "not_ready": []}]}

            (status,) = call(port, "/status").json()
            manifest = pipe.manifest()
            # laredo's Status fields, then this project's, equal to the manifest.
            assert list(status)[:7] == ["table", "epoch", "head_position", "buffer_depth", "churn_records",
                                        "last_snapshot_at", "position"]
            assert (status["table"], status["epoch"], status["head_position"]) == (TABLE, 1, manifest.head_position)
            assert status["head_position"] == "0/3A" and status["artifacts"] == len(manifest.artifacts) == 3
            assert (status["last_snapshot_at"], status["last_snapshot_position"]) == (snap.created_at, "0/10")
            assert (status["last_diff_at"], status["last_diff_position"]) == (last.created_at, "0/3A")
            assert status["diffs_since_snapshot"] == 2 and status["ready"] and status["ingest_alive"]
            assert status["collected_at"].endswith("Z")

            metrics = call(port, "/metrics")
            assert metrics.code == 200 and metrics.content_type.startswith("text/plain")
            assert metric(metrics.text, "manifest_head_position", TABLE) == float(parse_lsn("0/3A") or -1) == 58.0
            assert metric(metrics.text, "diffs_since_snapshot", TABLE) == 2.0
            assert metric(metrics.text, "epoch", TABLE) == 1.0 and metric(metrics.text, "ready", TABLE) == 1.0
            assert "process_cpu_seconds_total" in metrics.text

        # The error answers name what is wrong.
        unknown = call(port, "/snapshot?table=public.nope", method="POST")
        assert unknown.code == 404
        assert unknown.json() == {"error": f"unknown table 'public.nope': the configured tables are {TABLE}"}
        no_instance = call(port, "/snapshot", method="POST")
        assert no_instance.code == 503 and "set DAGSTER_HOME" in no_instance.json()["error"]
        assert call(port, "/snapshot").code == 405 and call(port, "/status", method="POST").code == 405
        assert call(port, "/nope").code == 404

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
