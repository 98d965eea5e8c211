"""Build locations: the same calls on a local folder and an S3 prefix (moto_server), no Spark needed."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from resources.destinations.s3 import S3Connection
from snapshot_assets.spark.locations import Location
from snapshot_assets.spark.remote_io import RemoteIOError
from snapshot_assets.spark.state import STATE_MARKER, STATE_VERSION, prune_state


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "local":
        return Location.of(tmp_path / "root")
    moto_server = request.getfixturevalue("moto_server")
    bucket = request.getfixturevalue("s3_bucket")
    return Location.of(f"s3://{bucket}/work/root/", S3Connection(endpoint_url=moto_server, path_style=True))


def _put(where: Location, name: str, data: bytes = b"x") -> None:
    """A file written the way tasks write them (Arrow's filesystem)."""
    filesystem, folder = where.filesystem()
    if not where.remote:
        Path(folder).mkdir(parents=True, exist_ok=True)
    with filesystem.open_output_stream(f"{folder}/{name}") as out:
        out.write(data)


def test_a_location_reads_writes_lists_and_clears_the_same_way_everywhere(root: Location) -> None:
    assert root.read_json("marker.json") is None
    root.write_json("marker.json", {"position": "0/1"})
    root.write_json("marker.json", {"position": "0/2"})  # replaced whole
    assert root.read_json("marker.json") == {"position": "0/2"}
    _put(root / "a", "one.parquet")
    _put(root / "b", "two.parquet")
    _put(root, "_hidden.parquet")
    assert root.folders() == ["a", "b"]
    assert root.list_files(".parquet") == []  # underscore-prefixed names are not data
    assert (root / "a").list_files(".parquet") == ["one.parquet"]
    (root / "a").delete("one.parquet")
    assert (root / "a").list_files() == []
    assert (root / "b").name == "b"
    root.clear()
    assert root.folders() == [] and root.read_json("marker.json") is None


def test_a_location_names_what_it_cannot_be() -> None:
    with pytest.raises(RemoteIOError, match="needs a bucket"):
        Location.of("s3:///prefix")
    with pytest.raises(RemoteIOError, match="a local path or an s3:// URI"):
        Location.of("gs://bucket/prefix")
    with pytest.raises(RemoteIOError, match="is in S3, not a local folder"):
        _ = Location.of("s3://bucket/prefix").path
    assert Location.of("s3://bucket/a/b/").parent.uri == "s3://bucket/a"
    with pytest.raises(RemoteIOError, match="a bucket has no parent"):
        _ = Location.of("s3://bucket").parent


def test_pruning_keeps_the_newest_state_its_buckets_and_its_deltas(root: Location) -> None:
    buckets = root / "buckets"
    for name in ("old-00000.parquet", "new-00000.parquet", "new-00001.parquet"):
        _put(buckets, name)
    marker = {"position": "0/9", "rows": 2, "key_fields": ["id"], "formats": ["jsonl"], "schema": None,
              "version": STATE_VERSION,
              "buckets": [{"lower": None, "path": (buckets / "new-00000.parquet").uri, "rows": 1, "sizes": {}},
                          {"lower": "01", "path": (buckets / "new-00001.parquet").uri, "rows": 1, "sizes": {}}]}
    (root / "epoch=2").write_json(STATE_MARKER, marker)
    (root / "epoch=1").write_json(STATE_MARKER, {**marker, "buckets": []})
    _put(root / "deltas" / "epoch=1" / "0-1", "part-00000.parquet")
    _put(root / "deltas" / "epoch=2" / "9-10", "part-00000.parquet")
    prune_state(root, 2)
    assert [n for n in root.folders() if n.startswith("epoch=")] == ["epoch=2"]
    assert (root / "deltas").folders() == ["epoch=2"]
    assert buckets.list_files(".parquet") == ["new-00000.parquet", "new-00001.parquet"]


def test_s3_locations_sign_with_the_connection_given(moto_server: str, s3_bucket: str) -> None:
    where = Location.of(f"s3://{s3_bucket}/p", S3Connection(endpoint_url=moto_server, path_style=True))
    where.write_json("m.json", [1])
    body = boto3.client("s3", endpoint_url=moto_server).get_object(Bucket=s3_bucket, Key="p/m.json")["Body"].read()
    assert body == b"[1]"
