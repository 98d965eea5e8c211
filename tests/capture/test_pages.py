"""Page bytes read back by decoders that share no code with ours: protoc (from the .proto) and the
standard library's json/base64/gzip; key templates; the capture block's config errors."""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from resources.capture.keys import KeyTemplateError, check_template, page_key
from resources.capture.settings import CaptureSettings
from resources.destinations.local import LocalDestination
from snapshot_assets.config import ConfigError, parse_config
from tests.capture.conftest import Running, settings_for, with_page

ROOT = Path(__file__).resolve().parents[2]
Serve = Callable[[CaptureSettings], Running]


def _protoc(*args: str, data: bytes) -> str:
    return subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "proto"), *args],
                          input=data, capture_output=True, check=True).stdout.decode()


def _stored(tmp_path: Path) -> list[bytes]:
    dest = LocalDestination(str(tmp_path / "pages"))
    return [dest.get(i.key).data for i in dest.list("pages/")]  # type: ignore[union-attr]


@pytest.mark.parametrize(("compression", "unpack"), [("gzip", gzip.decompress),
                                                     ("zstd", lambda b: zstandard.ZstdDecompressor().decompressobj()
                                                      .decompress(b))])
def test_protobuf_page_decodes_with_protoc_from_the_proto(tmp_path: Path, serve: Serve, compression: str,
                                                          unpack: Callable[[bytes], bytes]) -> None:
    running = serve(with_page(settings_for(tmp_path), compression=compression, tags={"env": "test"}))
    running.publish("user-1", b"\x00\x01binary", type="user.login")
    running.publish("user-1", b"second", type="user.click")
    running.stop()
    [page] = _stored(tmp_path)
    raw = unpack(page)
    text = _protoc("--decode=prism.snapshotter.EventPage", str(ROOT / "proto/prism/snapshotter/page.proto"), data=raw)
    assert 'writer_id: "user-1"' in text and "event_count: 2" in text and f'compression: "{compression}"' in text
    assert 'payload: "\\000\\001binary"' in text and 'payload: "second"' in text
    assert f"page_size_bytes: {len(raw)}" in text
    # RFC-023's field numbers, read without any schema.
    numbered = _protoc("--decode_raw", data=raw)
    assert numbered.startswith("1 {\n  1: \"user-1\"\n")
    assert '2 {\n  1: "user-1:0"\n  2: ' in numbered and '3: "\\000\\001binary"' in numbered
    assert '4 {\n    1: "type"\n    2: "user.login"\n  }' in numbered and "\n  5: 1\n" in numbered
    assert '7: "v1"' in numbered and f'8: "{compression}"' in numbered and '9 {\n    1: "env"' in numbered


def test_ndjson_page_reads_with_json_and_base64(tmp_path: Path, serve: Serve) -> None:
    settings = with_page(settings_for(tmp_path), format="ndjson", compression="gzip")
    running = serve(settings)
    sent = [bytes([i]) * 5 + b"\n\"{" for i in range(3)]
    for payload in sent:
        running.publish("w", payload, k="v")
    running.stop()
    [page] = _stored(tmp_path)
    lines = gzip.decompress(page).decode().splitlines()
    meta = json.loads(lines[0])["metadata"]
    assert set(meta) == {"writer_id", "page_sequence", "start_time", "end_time", "event_count", "page_size_bytes",
                         "format_version", "compression", "tags"}
    assert (meta["writer_id"], meta["event_count"], meta["compression"]) == ("w", 3, "gzip")
    assert meta["page_size_bytes"] == len(gzip.decompress(page))
    events = [json.loads(line) for line in lines[1:]]
    assert [base64.b64decode(e["payload"]) for e in events] == sent
    assert [e["sequence"] for e in events] == [0, 1, 2] and events[0]["attributes"] == {"k": "v"}


def test_uncompressed_page_without_metadata_drops_attributes(tmp_path: Path, serve: Serve) -> None:
    running = serve(with_page(settings_for(tmp_path), compression="none", include_metadata=False))
    running.publish("w", b"p", secret="attr")
    running.stop()
    [page] = _stored(tmp_path)
    text = _protoc("--decode=prism.snapshotter.EventPage", str(ROOT / "proto/prism/snapshotter/page.proto"), data=page)
    assert 'payload: "p"' in text and "secret" not in text


def test_key_template_placeholders_and_identity() -> None:
    template = "snapshots/{year}/{month}/{day}/{date}/{writer_id}/{timestamp}_{sequence}.pb.gz"
    key = page_key(template, "user/../1", 42, 1_696_800_000_123)
    assert key == "snapshots/2023/10/08/2023-10-08/user%2F..%2F1/1696800000123_00000000000000000042.pb.gz"
    assert page_key(template, "user/../1", 42, 1_696_800_000_123) == key  # same page, same key
    with pytest.raises(KeyTemplateError, match=r"unknown placeholder \{hour\}"):
        check_template("{writer_id}/{hour}/{sequence}")
    with pytest.raises(KeyTemplateError, match="take no format"):
        check_template("{writer_id}/{sequence:08d}")
    with pytest.raises(KeyTemplateError, match="malformed"):
        check_template("{writer_id}/{sequence")
    with pytest.raises(KeyTemplateError, match=r"must contain \{sequence\}"):
        check_template("{writer_id}/{timestamp}")


_DEST = "storage { destination { type = local, path = /tmp/p } }"


def _capture(body: str) -> str:
    return "snapshotter { capture { " + body + " } }"


def test_capture_block_loads_alone_with_defaults() -> None:
    config = parse_config(_capture(_DEST))
    assert config.tables == () and config.capture is not None
    assert (config.capture.buffer.max_events, config.capture.page.format, config.capture.page.compression) == (
        1000, "protobuf", "gzip")


@pytest.mark.parametrize(("body", "path", "message"), [
    (_DEST + " page { compression = lz4 }", "capture.page.compression", "unknown value 'lz4'"),
    (_DEST + " page { format = avro }", "capture.page.format", "unknown value 'avro'"),
    ('storage { destination { type = local, path = /tmp/p }, key_template = "{writer_id}/{week}/{sequence}" }',
     "capture.storage.key_template", "unknown placeholder {week}"),
    (_DEST + " buffer { max_evnts = 5 }", "capture.buffer.max_evnts", "unknown key"),
    (_DEST + " buffer { max_events = 0 }", "capture.buffer.max_events", "must be greater than 0"),
    (_DEST + " index { backend = postgres }", "capture.index.dsn", "is required for a postgres index"),
    ("buffer { max_events = 5 }", "capture.storage.destination", "is required"),
])
def test_capture_block_errors_name_the_key(body: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_capture(body))
    assert path in str(err.value) and message in str(err.value)
