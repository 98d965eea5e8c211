"""Helpers of the AWS tests: a table config around given destinations/events/profiles, artifacts
written without Spark (the archive writer), and plain boto3 clients on a test endpoint."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import boto3

from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.manifest import Artifact
from snapshot_assets.archive.writer import ArtifactWriter
from snapshot_assets.config import SnapshotterConfig, TableConfig, parse_config
from snapshot_assets.pipeline.table import TablePipeline

TABLE = "public.users"
PREFIX = "users/"
ROWS = [{"id": i, "name": f"user {i}"} for i in range(1, 6)]


def client(service: str, endpoint: str, **kw: Any) -> Any:
    make: Callable[..., Any] = boto3.client
    return make(service, endpoint_url=endpoint, region_name="us-east-1", **kw)


def bucket(endpoint: str) -> str:
    name = f"aws-{uuid.uuid4().hex[:16]}"
    client("s3", endpoint).create_bucket(Bucket=name)
    return name


def s3_dest(bucket_name: str, endpoint: str, profile: str = "", **extra: Any) -> str:
    """A HOCON s3 destination."""
    fields = {"type": "s3", "bucket": bucket_name, "prefix": "archive/", "endpoint_url": endpoint,
              "path_style": True, "region": "us-east-1", **extra}
    if profile:
        fields["credentials"] = profile
    return json.dumps(fields)


def config(tmp: Path, destinations: Sequence[str], *, events: Sequence[str] = (), credentials: str = "",
           formats: str = "[jsonl, parquet]") -> SnapshotterConfig:
    text = f"""snapshotter {{
      source {{ type = generator, table = users }}
      destinations = [ {", ".join(destinations)} ]
      events = [ {", ".join(events)} ]
      formats {{ snapshot = {formats}, diff = {formats} }}
      buffer.path = "{tmp / 'buffer'}"
      credentials {{ {credentials} }}
    }}"""
    return parse_config(text, env={})


def table(tmp: Path, destinations: Sequence[str], **kw: Any) -> TableConfig:
    return config(tmp, destinations, **kw).tables[0]


def snapshot(pipe: TablePipeline, position: str = "0/10", epoch: int = 1) -> Artifact:
    writer = ArtifactWriter(pipe.destinations, pipe.cfg.key_prefix, snapshot_formats=pipe.cfg.snapshot_formats,
                            diff_formats=pipe.cfg.diff_formats)
    return writer.write_snapshot(epoch, position, ROWS)


def diff(pipe: TablePipeline, from_position: str, to_position: str, epoch: int = 1, ident: int = 1) -> Artifact:
    writer = ArtifactWriter(pipe.destinations, pipe.cfg.key_prefix, snapshot_formats=pipe.cfg.snapshot_formats,
                            diff_formats=pipe.cfg.diff_formats)
    row = {"id": ident, "name": f"renamed at {to_position}"}
    change = Change(Action.UPDATE, key=str(ident), old={"id": ident, "name": f"user {ident}"}, new=row)
    return writer.write_diff(epoch, from_position, to_position, [change])
