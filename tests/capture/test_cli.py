"""`snapshotter capture-serve` and `snapshotter replay` as processes: health and metrics while
events are buffered, replay output after a graceful stop, one-line errors for bad configuration."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest

from resources.proto.prism.interfaces import pubsub_basic_pb2 as pb
from resources.proto.prism.interfaces import pubsub_basic_pb2_grpc as pb_grpc

CONFIG = """snapshotter { capture {
  buffer { path = "%(root)s/buffer", max_age_seconds = 1h }
  page { format = ndjson, compression = zstd }
  storage { destination { type = local, path = "%(root)s/pages" }, key_template = "%(template)s" }
} }
"""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "snapshot_assets.cli", *args]


def _http(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        body: str = response.read().decode()
        return body


@pytest.mark.slow
def test_serve_health_metrics_then_replay(tmp_path: Path) -> None:
    config = tmp_path / "capture.conf"
    config.write_text(CONFIG % {"root": tmp_path, "template": "e/{writer_id}/{sequence}.ndjson.zst"})
    proc = subprocess.Popen(_cli("capture-serve", "--config", str(config), "--port", "0", "--http-port", "0",
                                 "--host", "127.0.0.1"), stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        grpc_port = int(line.split("listening on ")[1].split(",")[0].rsplit(":", 1)[1])
        http_port = int(line.rsplit("http ", 1)[1])
        sent = [os.urandom(64) for _ in range(5)]
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = pb_grpc.PubSubBasicInterfaceStub(channel)
            for payload in sent:
                stub.Publish(pb.PublishRequest(topic="cli-writer", payload=payload), timeout=30)
        health = json.loads(_http(http_port, "/health/buffers"))
        assert (health["active_writers"], health["total_buffered_events"]) == (1, 5)
        assert health["total_buffer_size_bytes"] == 5 * 64
        assert 'snapshotter_buffer_event_count{writer_id="cli-writer"} 5.0' in _http(http_port, "/metrics")
        assert json.loads(_http(http_port, "/health/storage"))["status"] == "healthy"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    out = subprocess.run(_cli("replay", "--config", str(config), "--writer", "cli-writer"), capture_output=True,
                         text=True, check=True).stdout
    events = [json.loads(line) for line in out.splitlines()]
    assert [base64.b64decode(e["payload"]) for e in events] == sent
    assert [e["sequence"] for e in events] == list(range(5))


def test_bad_configuration_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "capture.conf"
    config.write_text(CONFIG % {"root": tmp_path, "template": "e/{writer_id}/{minute}/{sequence}"})
    run = subprocess.run(_cli("capture-serve", "--config", str(config)), capture_output=True, text=True)
    assert run.returncode == 1
    assert "capture.storage.key_template" in run.stderr and "unknown placeholder {minute}" in run.stderr
    assert "Traceback" not in run.stderr
    config.write_text(CONFIG % {"root": tmp_path, "template": "e/{writer_id}/{sequence}"})
    run = subprocess.run(_cli("replay", "--config", str(config), "--writer", "w", "--from", "yesterday"),
                         capture_output=True, text=True)
    assert run.returncode == 1 and "cannot parse time 'yesterday'" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
def test_a_batch_is_all_or_nothing_when_the_disk_refuses(tmp_path: Path) -> None:
    """The file size limit (RLIMIT_FSIZE, EFBIG) stands in for a full disk: writer b's append fails
    after writer a's succeeded; a's is cut back off, the batch answers UNAVAILABLE, and a's next
    event takes the sequence the refused one would have had."""
    import resource

    config = tmp_path / "capture.conf"
    config.write_text(CONFIG % {"root": tmp_path, "template": "e/{writer_id}/{sequence}.ndjson.zst"})
    limit = 64 * 1024

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.Popen(_cli("capture-serve", "--config", str(config), "--port", "0", "--host", "127.0.0.1"),
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=small_files)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip().rsplit(":", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.PubSubBasicInterfaceStub(channel)
            stub.Publish(pb.PublishRequest(topic="b", payload=bytes(60 * 1024)), timeout=30)
            batch = pb.BatchPublishRequest(requests=[pb.PublishRequest(topic="a", payload=b"first of a"),
                                                     pb.PublishRequest(topic="b", payload=bytes(8 * 1024))])
            with pytest.raises(grpc.RpcError) as err:
                stub.BatchPublish(batch, timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "publish again" in err.value.details()
            again = stub.Publish(pb.PublishRequest(topic="a", payload=b"second of a"), timeout=30)
            assert again.sequence == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    out = subprocess.run(_cli("replay", "--config", str(config), "--writer", "a"), capture_output=True, text=True,
                         check=True).stdout
    assert [base64.b64decode(json.loads(line)["payload"]) for line in out.splitlines()] == [b"second of a"]
