"""The destinations every seam suite runs against: local disk, S3 (moto_server), S3 under a prefix,
and the counting wrapper the pipeline uses every destination through, over local disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from resources.destinations.base import Destination
from resources.destinations.local import LocalDestination
from resources.destinations.s3 import MiB, S3Destination
from snapshot_assets.counters import CounterStore, CountingDestination

S3_PREFIX = "archive/v1/"
# Objects outside the destination's prefix that an s3-with-prefix destination must never see.
OUTSIDERS = ("decoy.txt", "archive/v1", "archive/v10/x.json", "archive/other/t/a.json")


def _local(tmp_path: Path) -> Destination:
    return LocalDestination(tmp_path / "root")


def _s3(bucket: str, endpoint: str, prefix: str = "") -> Destination:
    return S3Destination(
        bucket,
        prefix=prefix,
        endpoint_url=endpoint,
        path_style=True,
        multipart_threshold=5 * MiB,
        part_size=5 * MiB,
        max_attempts=2,
        connect_timeout=2,
        read_timeout=10,
    )


def _s3_with_prefix(bucket: str, endpoint: str) -> Destination:
    client = boto3.client("s3", endpoint_url=endpoint)
    for key in OUTSIDERS:
        client.put_object(Bucket=bucket, Key=key, Body=b"not mine")
    return _s3(bucket, endpoint, S3_PREFIX)


@pytest.fixture(params=["local", "s3", "s3-with-prefix", "counting-local"])
def dest(request: pytest.FixtureRequest, tmp_path: Path) -> Destination:
    if request.param == "local":
        return _local(tmp_path)
    if request.param == "counting-local":  # the wrapper every pipeline destination is used through
        return CountingDestination(_local(tmp_path), CounterStore(tmp_path / "metrics", "t"))
    endpoint: str = request.getfixturevalue("moto_server")
    bucket: str = request.getfixturevalue("s3_bucket")
    build: Callable[[str, str], Destination] = _s3 if request.param == "s3" else _s3_with_prefix
    return build(bucket, endpoint)
