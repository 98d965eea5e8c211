"""kill -9 of a `capture-serve` process under concurrent publishers, then restart: every
acknowledged event is in exactly one stored page, and no event is in two."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from resources.capture.pages import decode
from resources.destinations.local import LocalDestination
from resources.proto.prism.interfaces import pubsub_basic_pb2 as pb
from resources.proto.prism.interfaces import pubsub_basic_pb2_grpc as pb_grpc

CONFIG = """snapshotter {
  capture {
    buffer { path = "%(root)s/buffer", max_events = 7, max_age_seconds = 0.3s }
    page { format = %(format)s, compression = gzip }
    storage { destination { type = local, path = "%(root)s/pages" }, key_template = "p/{writer_id}/{sequence}" }
  }
}
"""


def _start(config: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "snapshot_assets.cli", "capture-serve", "--config", str(config),
                             "--port", "0", "--host", "127.0.0.1"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until recovery is done and the port is bound
    assert "listening on" in line, line
    return proc, int(line.rsplit(":", 1)[1].split(",")[0])


def _publishers(port: int, acked: dict[bytes, tuple[str, int]], stop: threading.Event, tag: str,
                threads: int = 8) -> list[threading.Thread]:
    lock = threading.Lock()

    def run(n: int) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.PubSubBasicInterfaceStub(channel)
            i = 0
            while not stop.is_set():
                payloads = [f"{tag}-t{n}-{i}-{k}".encode() for k in range(3)]
                writer = f"w{(n + i) % 4}"
                try:
                    if i % 2:
                        r = stub.Publish(pb.PublishRequest(topic=writer, payload=payloads[0]), timeout=5)
                        got = [(payloads[0], r)]
                    else:
                        batch = stub.BatchPublish(pb.BatchPublishRequest(
                            requests=[pb.PublishRequest(topic=writer, payload=p) for p in payloads]), timeout=5)
                        got = list(zip(payloads, batch.responses, strict=True))
                except grpc.RpcError:
                    return  # the server died: whatever was not answered was not acknowledged
                with lock:
                    for payload, response in got:
                        acked[payload] = (writer, response.sequence)
                i += 1

    workers = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(threads)]
    for w in workers:
        w.start()
    return workers


@pytest.mark.slow
@pytest.mark.parametrize("page_format", ["protobuf", "ndjson"])
def test_kill_9_under_load_loses_and_duplicates_nothing(tmp_path: Path, page_format: str) -> None:
    config = tmp_path / "capture.conf"
    config.write_text(CONFIG % {"root": tmp_path, "format": page_format})
    acked: dict[bytes, tuple[str, int]] = {}
    for round_ in range(3):
        proc, port = _start(config)
        stop = threading.Event()
        workers = _publishers(port, acked, stop, f"r{round_}")
        before = len(acked)
        deadline = time.monotonic() + 30
        while len(acked) < before + 600 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        stop.set()
        for w in workers:
            w.join(10)
        assert len(acked) >= before + 600, "the publishers made no progress"
    proc, _ = _start(config)  # recovery re-flushes what the last kill left
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0

    dest = LocalDestination(str(tmp_path / "pages"))
    seen: Counter[bytes] = Counter()
    where: dict[bytes, tuple[str, int]] = {}
    for info in dest.list("p/"):
        page = decode(dest.get(info.key).data)  # type: ignore[union-attr]
        for event in page.events:
            seen[event.payload] += 1
            where[event.payload] = (page.metadata.writer_id, event.sequence)
    assert [p for p, n in seen.items() if n > 1] == []
    missing = [p for p in acked if p not in seen]
    assert missing == [], f"{len(missing)} acknowledged events are in no page"
    assert all(where[p] == ack for p, ack in acked.items())  # the sequence each publisher was told
    for writer in {w for w, _ in where.values()}:
        sequences = sorted(s for w, s in where.values() if w == writer)
        assert sequences == list(range(len(sequences)))  # no gap, no reuse across restarts
