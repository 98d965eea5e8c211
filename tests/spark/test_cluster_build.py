"""Builds on a standalone cluster whose hosts share nothing but S3 equal the local runtime's, byte for byte.

The cluster (tests/spark/cluster.py: a master, two workers with their own directories, reached
through Spark Connect) builds a table's archive with everything in S3 on moto_server: the buffer's
segment files, the state (bucket files and markers), each diff's delta, the scratch datasets, and
the destination, which the tasks send their pieces into. The same chain (full snapshot, two diffs,
an incremental re-base) built by the local runtime with local paths and today's staging is the
oracle: jsonl and protobuf objects must be equal byte for byte; parquet objects hold the same
columns, encodings and rows. (A parquet snapshot has a row group per bucket, and the bucket bounds
come from a sample of the keys, which Spark draws per partition: the two runtimes split the same
rows at other bounds. A parquet diff is written by Arrow's writer in one task on the cluster, since
Spark's writer cannot reach S3 here and its committer needs a disk shared with the driver.) The
endpoint's record shows that the executors, not the driver, read the segments and wrote the
bucket files and the pieces.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pyarrow.parquet as pq
import pytest

from resources.buffer.reader import BufferReader, SegmentRef
from resources.destinations.base import Destination
from resources.destinations.local import LocalDestination
from resources.destinations.s3 import S3Connection, S3Destination
from resources.subscribers.generator import KEY_FIELDS
from snapshot_assets.archive.formats import FORMATS, get_format
from snapshot_assets.archive.formats.parquet import SPARK_SCHEMA_KEY
from snapshot_assets.archive.key_index import INDEX_EXTENSION, KeyIndex
from snapshot_assets.archive.positions import compare_lsn
from snapshot_assets.spark.assemble import artifact_key, assemble
from snapshot_assets.spark.bases import ArtifactBase, BufferSnapshotBase, DeltaSet, LayeredBase, choose_base
from snapshot_assets.spark.diff import build_diff
from snapshot_assets.spark.locations import Location
from snapshot_assets.spark.parts import BuiltArtifact
from snapshot_assets.spark.pieces import Targets
from snapshot_assets.spark.session import CONNECT_MODE
from snapshot_assets.spark.snapshot import build_snapshot
from snapshot_assets.spark.state import StateBase
from tests.aws.conftest import Moto, credential_of, start_moto
from tests.spark.cluster import EXECUTOR_ACCESS_KEY, SparkCluster
from tests.spark.conftest import TABLE, Generated, generate

pytestmark = [pytest.mark.s3, pytest.mark.slow]  # a cluster's JVMs and tens of Spark jobs

BUCKET = "shared"
PREFIX = "archive/"
ALL = tuple(FORMATS)  # jsonl, protobuf, parquet: every snapshot and diff in each
BUCKET_BYTES = 12 * 1024  # tens of buckets for a few thousand rows, so a re-base touches only some


@dataclass
class Runtime:
    """Where one runtime's chain lives: its session, destination, locations and segment addresses."""

    spark: Any
    dest: Destination
    place: Callable[[str], Path | Location]
    segment: Callable[[SegmentRef], SegmentRef]
    buffer_s3: S3Connection | None
    sends: bool  # the tasks send their pieces into the destination (the build gets its targets)

    def targets(self, epoch: int) -> Targets | None:
        return Targets((self.dest,), PREFIX, epoch) if self.sends else None


def _chain(rt: Runtime, g: Generated, positions: tuple[str, str, str, str]) -> list[BuiltArtifact]:
    """Snapshot at p1 (full, from the initial load), diffs (p1, p2] and (p2, p3], snapshot at p4
    (incremental from the state and both deltas), each assembled into the runtime's destination."""
    p1, p2, p3, p4 = positions
    reader: BufferReader = g.reader

    def segments(a: str, b: str) -> list[SegmentRef]:
        return [rt.segment(s) for s in reader.segments(a, b)]

    base, first = choose_base(reader, p1)
    assert isinstance(base, BufferSnapshotBase)
    snap1 = build_snapshot(rt.spark, BufferSnapshotBase(rt.segment(base.segment), rt.buffer_s3),
                           [rt.segment(s) for s in first], p1, KEY_FIELDS, ALL, rt.place("staging"),
                           rt.place("state/epoch=1"), bucket_bytes=BUCKET_BYTES, targets=rt.targets(1),
                           buffer_s3=rt.buffer_s3)
    refs1 = assemble(snap1, [rt.dest], PREFIX, 1)
    state1 = StateBase.load(rt.place("state/epoch=1"), rt.buffer_s3)  # the marker, read back where it lives
    assert state1 is not None and state1 == snap1.details["state"]
    built = [snap1]
    deltas: list[DeltaSet] = []
    for a, b, name in ((p1, p2, "d1"), (p2, p3, "d2")):
        diff = build_diff(rt.spark, segments(a, b), LayeredBase(state1, tuple(deltas)), b, KEY_FIELDS, ALL,
                          rt.place("staging"), rt.place(f"deltas/{name}"), state_formats=ALL,
                          targets=rt.targets(1), buffer_s3=rt.buffer_s3)
        assemble(diff, [rt.dest], PREFIX, 1)
        deltas.append(diff.details["delta"])
        built.append(diff)
    previous = {f: artifact_key(PREFIX, snap1, 1, get_format(f).extension) for f in ("jsonl", "protobuf")}
    assert all(refs1[f].uri.endswith(k) for f, k in previous.items())
    previous["versions"] = artifact_key(PREFIX, snap1, 1, ".versions")  # the versions object beside it
    snap2 = build_snapshot(rt.spark, LayeredBase(state1, tuple(deltas)), segments(p3, p4), p4, KEY_FIELDS, ALL,
                           rt.place("staging"), rt.place("state/epoch=2"), previous_keys=previous,
                           bucket_bytes=BUCKET_BYTES, targets=rt.targets(2), buffer_s3=rt.buffer_s3)
    assemble(snap2, [rt.dest], PREFIX, 2)
    built.append(snap2)
    return built


def _objects(dest: Destination) -> dict[str, bytes]:
    out = {}
    for info in dest.list(PREFIX):
        got = dest.get(info.key)
        assert got is not None
        out[info.key] = got.data
    return out


def _parquet_view(data: bytes, kind: str) -> tuple[Any, ...]:
    """What a parquet artifact says, whoever wrote it: Arrow schema and rows, Spark's schema JSON
    (the columns' encodings), and the rows the project's reader makes of it. A snapshot's rows are
    compared as a set: the local runtime's Spark reader packs the state's bucket files by size, so
    its file is not in key order (nothing reads a snapshot in order); a diff's order is fixed."""
    table = pq.read_table(io.BytesIO(data))
    fmt = get_format("parquet")
    spark_schema = json.loads((table.schema.metadata or {})[SPARK_SCHEMA_KEY])
    if kind == "snapshot":
        rows = sorted(table.to_pylist(), key=repr)
        read: list[Any] = sorted(fmt.read_snapshot(io.BytesIO(data)), key=repr)
    else:
        rows = table.to_pylist()
        read = [(c.action, c.key, c.old, c.new) for c in fmt.read_diff(io.BytesIO(data))]
    return table.schema.remove_metadata(), rows, spark_schema, read


def _signed(moto: Moto) -> list[tuple[str, str, str]]:
    """(method, url, access key) of every request the endpoint recorded."""
    out = []
    for request in moto.requests():
        signed = credential_of(request)
        out.append((request["method"], str(request["url"]), signed[0] if signed else ""))
    return out


def _assert_index_fits(index: KeyIndex, jsonl: bytes) -> None:
    """A key index over `jsonl` (byte-identical on both runtimes): its sort keys ascend, and every
    entry starts a line of the object it claims the size of."""
    offsets = list(index.offsets["jsonl"])
    assert index.sizes["jsonl"] == len(jsonl) and offsets and offsets == sorted(set(offsets))
    assert list(index.sks) == sorted(index.sks)
    assert all(o == 0 or jsonl[o - 1:o] == b"\n" for o in offsets)


def test_a_cluster_sharing_only_s3_builds_the_local_runtimes_archive(
        spark_cluster: SparkCluster, cluster_spark: Any, spark: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    g = generate(tmp_path / "buffer", seed=29, rows=2500, changes=2400, seal_changes=300, identity="default",
                 pk_change=0.02)
    ends = [b for b in g.boundaries if compare_lsn(b, g.resyncs[0]) > 0]
    # The first snapshot holds most of the changes; the two diffs and the re-base after it only a
    # few transactions, so the re-base falls into some of the buckets, not all.
    positions = (ends[-7], ends[-5], ends[-3], ends[-1])

    moto = start_moto(tmp_path, record=True)
    try:
        s3 = boto3.client("s3", endpoint_url=moto.url)
        s3.create_bucket(Bucket=BUCKET)
        connection = S3Connection(endpoint_url=moto.url, path_style=True)
        segment_key = f"buffer/{TABLE}/segments/"
        for ref in g.reader.all_segments():  # what the S3 buffer storage holds
            s3.upload_file(ref.path, BUCKET, segment_key + Path(ref.path).name)
        moto.recording.write_text("")
        remote = Runtime(cluster_spark, S3Destination(BUCKET, endpoint_url=moto.url, path_style=True),
                         lambda name: Location(f"s3://{BUCKET}/work/{name}", connection),
                         lambda ref: dataclasses.replace(ref, path=f"s3://{BUCKET}/{segment_key}{Path(ref.path).name}"),
                         connection, sends=True)
        with monkeypatch.context() as mode:  # this process also holds a classic session (the local run)
            mode.setenv(CONNECT_MODE, "1")
            cluster_built = _chain(remote, g, positions)
            # The same table from the first snapshot's jsonl object in S3 (a lost state's fallback),
            # read by the tasks: a full build whose jsonl equals the incremental re-base's.
            snap1_jsonl = f"s3://{BUCKET}/{PREFIX}{artifact_key('', cluster_built[0], 1, '.jsonl')}"
            again = build_snapshot(
                cluster_spark, ArtifactBase((snap1_jsonl,), "jsonl", positions[0], connection),
                [remote.segment(s) for s in g.reader.segments(positions[0], positions[3])], positions[3], KEY_FIELDS,
                ("jsonl",), remote.place("staging"), remote.place("state/epoch=3"), bucket_bytes=BUCKET_BYTES,
                targets=Targets((remote.dest,), "again/", 3), buffer_s3=connection)
            assemble(again, [remote.dest], "again/", 3)
        on_s3 = _objects(remote.dest)
        from_artifact = remote.dest.get(artifact_key("again/", again, 3, ".jsonl"))
        record = _signed(moto)
        leftovers = s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
        staged_left = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX).get("Contents", [])
                       if ".parts-" in o["Key"]]
    finally:
        moto.stop()

    local = Runtime(spark, LocalDestination(tmp_path / "archive"), lambda name: tmp_path / "local" / name,
                    lambda ref: ref, None, sends=False)
    local_built = _chain(local, g, positions)

    on_disk = _objects(local.dest)
    # the artifacts' formats, both snapshots' key indexes, every artifact's versions object (byte-equal below)
    assert sorted(on_s3) == sorted(on_disk) and len(on_disk) == 4 * len(ALL) + 2 + 4
    for key, data in on_disk.items():
        if key.endswith(".parquet"):
            kind = "snapshot" if "/snapshot-" in key or key.rsplit("/", 1)[-1].startswith("snapshot") else "diff"
            assert _parquet_view(on_s3[key], kind) == _parquet_view(data, kind), key
        elif key.endswith(INDEX_EXTENSION):  # entries fall where each runtime's task batches put them
            jsonl = on_disk[key.removesuffix(INDEX_EXTENSION) + ".jsonl"]
            _assert_index_fits(KeyIndex.loads(on_s3[key], key), jsonl)
            _assert_index_fits(KeyIndex.loads(data, key), jsonl)
        else:
            assert on_s3[key] == data, key
    assert not leftovers and not staged_left  # every upload completed, its staged heads dropped
    assert again.details["mode"] == "full" and from_artifact is not None
    assert from_artifact.data == on_disk[artifact_key(PREFIX, local_built[-1], 2, ".jsonl")]

    for built in (local_built[-1], cluster_built[-1]):  # the re-base rewrote only the buckets it touched
        assert built.details["mode"] == "incremental"
        assert 0 < built.details["rewritten"] < built.details["buckets"]
    states = [b.details["state"] for b in cluster_built if b.kind == "snapshot"]
    assert all(f.startswith(f"s3://{BUCKET}/work/state/buckets/") for s in states for f in s.files())
    assert [b.count for b in cluster_built] == [b.count for b in local_built]

    # Who did what: the executors read the segments and wrote the bucket files and the pieces;
    # the driver wrote only markers, each parquet snapshot's magic and merged footer (two small
    # pieces per upload: parquet_pieces.py), completed uploads and merged small heads into parts.
    segment_reads = {key for method, url, key in record if method == "GET" and segment_key in url}
    bucket_writes = {key for method, url, key in record if method in ("PUT", "POST") and "/state/buckets/" in url}
    head_writes = {key for method, url, key in record if method == "PUT" and ".parts-" in url}
    driver_heads = Counter(url.split("?")[0].rsplit("/", 1)[0] for method, url, key in record
                           if method == "PUT" and ".parts-" in url and key != EXECUTOR_ACCESS_KEY)
    assert segment_reads == bucket_writes == {EXECUTOR_ACCESS_KEY} and EXECUTOR_ACCESS_KEY in head_writes
    assert driver_heads and all(".parquet.parts-" in upload and count == 2 for upload, count in driver_heads.items())
    markers = {key for method, url, key in record if method == "PUT" and "_snapshotter_state.json" in url}
    assert markers == {"testing"}


def test_targets_on_a_local_runtime_send_the_pieces_into_a_local_destination(spark: Any, tmp_path: Path) -> None:
    """The same chain on the local runtime, once staging pieces for the driver to upload and once with
    the tasks sending them into a local destination's uploads: the same objects, byte for byte (parquet
    too: a snapshot's from the same bucket pieces, a diff by Spark's writer into the local staging folder)."""
    g = generate(tmp_path / "buffer", seed=31, rows=400, changes=500, seal_changes=100)
    ends = [b for b in g.boundaries if compare_lsn(b, g.resyncs[0]) > 0]
    positions = (ends[len(ends) // 4], ends[len(ends) // 2], ends[3 * len(ends) // 4], ends[-1])
    objects = []
    for name, sends in (("staged", False), ("sent", True)):
        rt = Runtime(spark, LocalDestination(tmp_path / name / "archive"),
                     lambda place, name=name: tmp_path / name / place,
                     lambda ref: ref, None, sends=sends)
        _chain(rt, g, positions)
        objects.append(_objects(rt.dest))
        assert not list((tmp_path / name / "archive").rglob("*.parts-*"))  # staged heads dropped
    # the formats, the key indexes and the versions objects
    assert sorted(objects[0]) == sorted(objects[1]) and len(objects[0]) == 4 * len(ALL) + 2 + 4
    assert all(objects[0][k] == objects[1][k] for k in objects[0])
