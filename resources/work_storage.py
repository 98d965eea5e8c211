"""Where the pipeline keeps what it needs between steps: one root, a local directory or an S3 prefix.

Ingest, sensors, runs and Spark executors may each run on another host, so everything they hand to
each other (the change buffer, the bucketed state, the outbox, the persisted counters) lives under
one configured root, `buffer.path`: a local directory when every component shares a disk, or
`s3://bucket/prefix` when they share nothing but object storage. The root is a destination built
by the same factory (and credential profiles) as the archive's destinations, so both kinds give the
same operations with the same guarantees: atomic whole-object writes, conditional writes
(`put_if`) for compare-and-swap, listing by prefix.

Each part of the working state gets its own sub-destination (`PrefixedDestination`): a view of the
root under a key prefix, sharing the root's client; Spark reaches the same places by `location`.
Scratch space that never needs to be seen by another host (the temp file a segment is written into
before it is published) stays in the host's TMPDIR: `scratch_file`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlsplit

from resources.destinations.base import Destination, GetResult, ObjectInfo, PutResult
from resources.destinations.local import LocalDestination

if TYPE_CHECKING:
    from resources.aws_credentials import CredentialProfiles
    from resources.destinations.multipart import MultipartUpload
    from resources.destinations.s3 import S3Connection

S3_SCHEME = "s3://"


def is_s3_uri(path: str) -> bool:
    return path.startswith(S3_SCHEME)


def root_spec(path: str, s3: Mapping[str, Any]) -> dict[str, Any]:
    """The destination spec of a working root: `s3://bucket/prefix` (+ connection keys) or a local path."""
    if not is_s3_uri(path):
        return {"type": "local", "path": path}
    parts = urlsplit(path)
    if not parts.netloc:
        raise ValueError(f"{path!r}: an s3 working root needs a bucket (s3://bucket/prefix)")
    prefix = parts.path.strip("/")
    return {"type": "s3", "bucket": parts.netloc, "prefix": f"{prefix}/" if prefix else "", **s3}


class PrefixedDestination:
    """`inner` seen under `prefix`: key `k` is `inner`'s key `prefix + k` (listing strips it again)."""

    def __init__(self, inner: Destination, prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.name = f"{getattr(inner, 'name', 'destination')}:{self.prefix}"

    def __repr__(self) -> str:
        return f"PrefixedDestination({self.inner!r}, {self.prefix!r})"

    def uri(self, key: str) -> str:
        return self.inner.uri(self.prefix + key)

    def put(self, key: str, stream: BinaryIO | bytes) -> PutResult:
        return self.inner.put(self.prefix + key, stream)

    def get(self, key: str) -> GetResult | None:
        return self.inner.get(self.prefix + key)

    def open_read(self, key: str) -> BinaryIO:
        return self.inner.open_read(self.prefix + key)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.read_range(self.prefix + key, start, length)

    def put_if(self, key: str, data: bytes, expected_revision: str | None) -> str:
        return self.inner.put_if(self.prefix + key, data, expected_revision)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        cut = len(self.prefix)
        return (ObjectInfo(info.key[cut:], info.size) for info in self.inner.list(self.prefix + prefix))

    def delete(self, key: str) -> None:
        self.inner.delete(self.prefix + key)

    def begin_multipart(self, key: str) -> MultipartUpload:
        return self.inner.begin_multipart(self.prefix + key)

    def abort_stale_uploads(self, prefix: str, older_than_s: float) -> tuple[str, ...]:
        return tuple(k[len(self.prefix):] for k in self.inner.abort_stale_uploads(self.prefix + prefix, older_than_s))


@dataclass(frozen=True)
class WorkRoot:
    """The configured working root (`buffer.path` + `buffer.s3`), opened once per process."""

    path: str
    root: Destination
    connection: S3Connection | None  # how a Spark task on another host reaches the root; None when local

    @classmethod
    def open(cls, path: str, s3: Mapping[str, Any] | None = None, *,
             profiles: CredentialProfiles | None = None) -> WorkRoot:
        spec = root_spec(path, s3 or {})
        if spec["type"] == "local":
            return cls(path, LocalDestination(path), None)
        from resources.destinations.factory import build_destination  # boto3 and dagster: only for S3

        root = build_destination(spec, profiles=profiles)
        return cls(path, root, getattr(root, "connection", None))

    @property
    def is_s3(self) -> bool:
        return is_s3_uri(self.path)

    def part(self, sub: str) -> PrefixedDestination:
        """The sub-destination for one part of the working state, e.g. `_outbox` or `<table>`."""
        return PrefixedDestination(self.root, sub)

    def location(self, sub: str) -> str:
        """The address of `sub` that Spark and other hosts use: a local path or `s3://bucket/prefix/sub`."""
        if self.is_s3:
            return self.path.rstrip("/") + "/" + sub
        return str(Path(self.path) / sub)


def scratch_file(prefix: str) -> BinaryIO:
    """An anonymous local temp file (in TMPDIR; gone when closed, or when the process dies)."""
    return tempfile.TemporaryFile(prefix=prefix)
