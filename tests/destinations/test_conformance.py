"""One conformance suite for every Destination: local disk, S3 (moto_server), S3 under a prefix (conftest.py).

The first three tests are laredo's desttest cases (snapshotter/desttest/desttest.go) verbatim, so
this project's destinations keep the behaviour laredo's writers and readers rely on.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from resources.destinations.base import CASConflict, Destination, DestinationError
from resources.destinations.factory import build_destination
from resources.destinations.local import LocalDestination
from resources.destinations.s3 import MiB, S3Destination


class TrickleStream(io.RawIOBase):
    """A non-seekable stream that returns at most `step` bytes per read (short reads are legal)."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._pos, self._step = data, 0, step

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        chunk = self._data[self._pos : self._pos + min(self._step, len(buffer))]
        buffer[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


def _keys(dest: Destination, prefix: str) -> list[str]:
    return [info.key for info in dest.list(prefix)]


# -- laredo desttest ------------------------------------------------------------------------------


def test_laredo_put_and_get(dest: Destination) -> None:
    put = dest.put("obj/a.txt", io.BytesIO(b"hello"))
    assert put.uri and put.size == 5 and put.revision
    got = dest.get("obj/a.txt")
    assert got is not None
    assert got.data == b"hello" and got.revision


def test_laredo_get_missing(dest: Destination) -> None:
    assert dest.get("does/not/exist") is None


def test_laredo_cas(dest: Destination) -> None:
    rev1 = dest.put_if("cas.json", b'{"v":1}', None)
    with pytest.raises(CASConflict):
        dest.put_if("cas.json", b'{"v":2}', "stale-rev")
    rev2 = dest.put_if("cas.json", b'{"v":2}', rev1)
    assert rev2 != rev1
    got = dest.get("cas.json")
    assert got is not None and got.data == b'{"v":2}'


# -- put / get ------------------------------------------------------------------------------------


def test_put_result_matches_get_and_uri(dest: Destination) -> None:
    put = dest.put("t/epoch=1/snapshot-0_1.jsonl", b"row\n")
    got = dest.get("t/epoch=1/snapshot-0_1.jsonl")
    assert got is not None and got.revision == put.revision
    assert put.uri == dest.uri("t/epoch=1/snapshot-0_1.jsonl")
    assert put.uri.startswith(("file:///", "s3://")) and put.uri.endswith("t/epoch=1/snapshot-0_1.jsonl")


def test_revision_is_stable_while_content_is(dest: Destination) -> None:
    dest.put("same.bin", b"x")
    first, second = dest.get("same.bin"), dest.get("same.bin")
    assert first is not None and second is not None and first.revision == second.revision


def test_put_replaces(dest: Destination) -> None:
    old = dest.put("k.txt", b"old").revision
    new = dest.put("k.txt", b"new contents").revision
    got = dest.get("k.txt")
    assert got is not None and got.data == b"new contents" and got.revision == new != old


def test_put_from_a_stream_with_short_reads(dest: Destination) -> None:
    data = os.urandom(100_003)
    put = dest.put("stream.bin", TrickleStream(data, step=4093))  # type: ignore[arg-type]
    got = dest.get("stream.bin")
    assert put.size == len(data) and got is not None and got.data == data


def test_empty_object(dest: Destination) -> None:
    assert dest.put("empty.pb", b"").size == 0
    got = dest.get("empty.pb")
    assert got is not None and got.data == b""


def test_large_object_above_multipart_threshold(dest: Destination) -> None:
    data = os.urandom(12 * MiB + 123)  # 5 MiB parts: 5 + 5 + 2 MiB
    put = dest.put("big/snapshot.jsonl", TrickleStream(data, step=MiB))  # type: ignore[arg-type]
    assert put.size == len(data)
    with dest.open_read("big/snapshot.jsonl") as stream:
        assert stream.read() == data
    assert [(i.key, i.size) for i in dest.list("big/")] == [("big/snapshot.jsonl", len(data))]


def test_open_read_streams_in_chunks(dest: Destination) -> None:
    data = os.urandom(300_000)
    dest.put("s/obj.bin", data)
    with dest.open_read("s/obj.bin") as stream:
        chunks = iter(lambda: stream.read(65_536), b"")
        assert b"".join(chunks) == data


def test_open_read_missing_raises_file_not_found(dest: Destination) -> None:
    with pytest.raises(FileNotFoundError):
        dest.open_read("does/not/exist")


# -- put_if ---------------------------------------------------------------------------------------


def test_put_if_creates_when_absent(dest: Destination) -> None:
    rev = dest.put_if("t/manifest.json", b"{}", None)
    got = dest.get("t/manifest.json")
    assert got is not None and got.data == b"{}" and got.revision == rev


def test_put_if_create_when_it_exists_conflicts(dest: Destination) -> None:
    dest.put("t/manifest.json", b"first")
    with pytest.raises(CASConflict):
        dest.put_if("t/manifest.json", b"second", None)
    got = dest.get("t/manifest.json")
    assert got is not None and got.data == b"first"


def test_put_if_stale_revision_conflicts(dest: Destination) -> None:
    rev1 = dest.put_if("m.json", b"v1", None)
    dest.put_if("m.json", b"v2", rev1)
    with pytest.raises(CASConflict):
        dest.put_if("m.json", b"v3", rev1)
    got = dest.get("m.json")
    assert got is not None and got.data == b"v2"


def test_put_if_expected_revision_but_object_missing_conflicts(dest: Destination) -> None:
    rev = dest.put("gone.json", b"v1").revision
    dest.delete("gone.json")
    with pytest.raises(CASConflict):
        dest.put_if("gone.json", b"v2", rev)
    assert dest.get("gone.json") is None


def test_put_if_correct_revision_swaps(dest: Destination) -> None:
    rev1 = dest.put("m.json", b'{"head":"0/10"}').revision
    rev2 = dest.put_if("m.json", b'{"head":"0/20"}', rev1)
    got = dest.get("m.json")
    assert rev2 and rev2 != rev1
    assert got is not None and got.data == b'{"head":"0/20"}' and got.revision == rev2


# -- list / delete --------------------------------------------------------------------------------


def test_list_is_sorted_relative_and_prefix_filtered(dest: Destination) -> None:
    objects = {"t/b.json": b"bb", "t/a/x": b"x", "t/a.json": b"aaaa", "t/a.b": b"", "u/z": b"z", "t.x": b"t"}
    for key, data in objects.items():
        dest.put(key, data)
    assert _keys(dest, "") == sorted(objects)
    assert [(i.key, i.size) for i in dest.list("t/")] == [
        ("t/a.b", 0),
        ("t/a.json", 4),
        ("t/a/x", 1),
        ("t/b.json", 2),
    ]
    assert _keys(dest, "t/a") == ["t/a.b", "t/a.json", "t/a/x"]  # a string prefix, not a folder
    assert _keys(dest, "nothing/") == []


def test_delete(dest: Destination) -> None:
    dest.put("d/one.json", b"1")
    dest.put("d/two.json", b"2")
    dest.delete("d/one.json")
    assert dest.get("d/one.json") is None
    assert _keys(dest, "d/") == ["d/two.json"]
    dest.delete("d/two.json")
    assert _keys(dest, "") == []


def test_delete_missing_is_not_an_error(dest: Destination) -> None:
    dest.delete("never/existed.json")
    dest.put("d/x", b"x")
    dest.delete("d/y")
    assert _keys(dest, "") == ["d/x"]


# -- factory: laredo destination config dicts -----------------------------------------------------


def test_factory_builds_every_suite_backend_from_laredo_config(tmp_path: Path, moto_server: str) -> None:
    local = build_destination({"type": "local", "path": str(tmp_path / "a"), "bucket": ""})
    s3 = build_destination(
        {"type": "s3", "bucket": "b", "prefix": "p/", "endpoint_url": moto_server, "path_style": "true"}
    )
    assert isinstance(local, LocalDestination) and local.uri("k") == f"file://{tmp_path}/a/k"
    assert isinstance(s3, S3Destination) and s3.uri("k") == "s3://b/p/k"


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"type": "gcs", "bucket": "b"}, "unknown destination type 'gcs' (known types: local, s3)"),
        ({"path": "/x"}, "unknown destination type ''"),
        ({"type": "local"}, "local destination requires 'path'"),
        ({"type": "s3", "bucket": ""}, "s3 destination requires 'bucket'"),
        ({"type": "s3", "bucket": "b", "endpoint": "http://x"}, "unknown keys ['endpoint']"),
        ({"type": "s3", "bucket": "b", "path_style": "maybe"}, "'path_style' must be a boolean"),
    ],
)
def test_factory_rejects_bad_specs_naming_the_problem(spec: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        build_destination(spec)
    assert message in str(raised.value)


def test_read_range_returns_only_the_requested_bytes(dest: Destination) -> None:
    data = bytes(range(256)) * 40
    dest.put("ranged/obj.bin", data)
    assert dest.read_range("ranged/obj.bin", 0, 10) == data[:10]
    assert dest.read_range("ranged/obj.bin", 1000, 333) == data[1000:1333]
    assert dest.read_range("ranged/obj.bin", len(data) - 5, 100) == data[-5:]  # short at the end
    assert dest.read_range("ranged/obj.bin", len(data) + 10, 5) == b""
    assert dest.read_range("ranged/obj.bin", 7, 0) == b""


def test_read_range_missing_and_bad_ranges(dest: Destination) -> None:
    with pytest.raises(FileNotFoundError):
        dest.read_range("ranged/missing.bin", 0, 10)
    dest.put("ranged/small.bin", b"abc")
    with pytest.raises(DestinationError, match="invalid byte range"):
        dest.read_range("ranged/small.bin", -1, 2)
