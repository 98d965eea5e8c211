"""S3 destination: streamed (multipart) artifact uploads and a manifest CAS on S3 conditional writes.

Keys are `prefix + key`, a plain concatenation exactly as laredo's S3 destination does (give the
prefix a trailing `/` to get a folder), so laredo and this project address the same objects.
The revision is the ETag that S3 returns, passed back verbatim as `If-Match`.

The hard part is `put_if` when the network fails after the request was sent: the write may or may
not have landed, and botocore may already have retried it on its own (its retry then sees our own
write and answers 412). Those outcomes are resolved by re-reading the object, never by guessing:
our bytes there -> we won; the old state still there -> retry the conditional PUT; anything else
-> CASConflict. Every failure leaves as DestinationError (or CASConflict) naming bucket and key.
"""

from __future__ import annotations

import contextlib
import io
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from resources.destinations.base import (
    CASConflict,
    DestinationError,
    GetResult,
    ObjectInfo,
    PutResult,
    check_range,
)
from resources.destinations.multipart import MAX_PARTS, MIN_PART_SIZE, MiB

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer
    from botocore.credentials import ReadOnlyCredentials
    from botocore.response import StreamingBody
    from types_boto3_s3 import S3Client
    from types_boto3_s3.type_defs import CompletedPartTypeDef, GetObjectOutputTypeDef

    from resources.destinations.s3_multipart import S3Upload
    from snapshot_assets.config import CredentialProfile

__all__ = ["MAX_PARTS", "MIN_PART_SIZE", "MiB", "S3Connection", "S3Destination", "build_s3_client"]
_BACKOFF_BASE = 0.05
_BACKOFF_CAP = 2.0

# Failures after which a PUT may or may not have been applied by S3.
_AMBIGUOUS_ERRORS = (BotoConnectionError, HTTPClientError)
_MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _was_retried(exc: ClientError) -> bool:
    """True when botocore re-sent the request itself: an earlier attempt may have been applied."""
    return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) > 0


def _is_missing(exc: ClientError) -> bool:
    # By code, not by status: a missing *bucket* is also a 404 and must not read as "no object".
    return _error_code(exc) in _MISSING_CODES


def _describe(exc: BaseException) -> str:
    """A one-line cause: the S3 error code and message, or the transport failure."""
    if isinstance(exc, ClientError):
        message = exc.response.get("Error", {}).get("Message", "")
        return f"{_error_code(exc) or 'error'} (HTTP {_http_status(exc)}): {message}".rstrip(": ")
    if isinstance(exc, EndpointConnectionError):
        return f"endpoint unreachable: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _same_etag(a: str, b: str) -> bool:
    return a.strip('"') == b.strip('"')


def _read_full(stream: BinaryIO, size: int) -> bytes:
    """Read `size` bytes or up to EOF (a stream may return short reads before its end)."""
    chunks: list[bytes] = []
    remaining = size
    while remaining > 0 and (chunk := stream.read(remaining)):
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _parts(head: bytes, stream: BinaryIO, part_size: int) -> Iterator[bytes]:
    """`head` followed by the rest of `stream`, cut into `part_size` pieces (the last may be short)."""
    buf = bytearray(head)
    while True:
        if len(buf) < part_size:
            buf += _read_full(stream, part_size - len(buf))
        if not buf:
            return
        yield bytes(buf[:part_size])
        del buf[:part_size]


def _as_stream(stream: BinaryIO | bytes) -> BinaryIO:
    return io.BytesIO(stream) if isinstance(stream, bytes | bytearray | memoryview) else stream


def _backoff(attempt: int) -> None:
    """Jittered exponential sleep before CAS attempt `attempt` (1-based retries)."""
    time.sleep(min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt) * random.uniform(0.5, 1.0))


def _client_settings(client: S3Client, region: str | None, endpoint_url: str | None,
                     path_style: bool) -> tuple[str | None, str | None, bool]:
    """The region, endpoint and addressing a given client really uses, where the spec left them out.

    Why: a Spark task rebuilds its own client from the destination's `S3Connection`; a client the
    code location's `s3` resource configured (an endpoint of its own, path-style addressing) must
    not turn into AWS's default endpoint there. AWS's own endpoints stay implicit.
    """
    meta = client.meta
    actual = str(meta.endpoint_url or "")
    if endpoint_url is None and actual and not actual.split("://", 1)[-1].split("/", 1)[0].endswith("amazonaws.com"):
        endpoint_url = actual
    addressing = (getattr(meta.config, "s3", None) or {}).get("addressing_style")
    return region or meta.region_name, endpoint_url, path_style or addressing == "path"


S3_SIGNATURE = "s3v4"
"""S3 clients sign SigV4 everywhere, presigned URLs included (botocore presigns SigV2 unless told)."""


def build_s3_client(
    region: str | None = None,
    endpoint_url: str | None = None,
    path_style: bool = False,
    *,
    connect_timeout: float = 10.0,
    read_timeout: float = 60.0,
    max_attempts: int = 5,
) -> S3Client:
    """A client with bounded timeouts and retries (`max_attempts` counts the first try).

    Each destination gets its own boto3 Session: creating clients from the shared default session
    is not thread-safe, while a finished client is.
    """
    config = Config(
        s3={"addressing_style": "path" if path_style else "auto"},
        signature_version=S3_SIGNATURE,
        retries={"total_max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        tcp_keepalive=True,
    )
    return boto3.session.Session().client("s3", region_name=region, endpoint_url=endpoint_url, config=config)


@dataclass(frozen=True, slots=True)
class S3Connection:
    """How a destination reaches its bucket, as plain picklable data: what a Spark task on another
    host needs to build a client of its own.

    It holds no secret. The task signs with what its own host provides: the ambient chain (its
    environment, instance or pod role) or, when `credentials` names a profile, that profile (its
    definition travels here: role ARN, external id, base), assumed again in the task's process.
    """

    region: str | None = None
    endpoint_url: str | None = None
    path_style: bool = False
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    max_attempts: int = 5
    credentials: str = ""
    profiles: tuple[CredentialProfile, ...] = ()

    def client(self, component: str) -> S3Client:
        """A new client; signed as the profile `credentials` when one is named (errors say `component`)."""
        if not self.credentials:
            return build_s3_client(self.region, self.endpoint_url, self.path_style,
                                   connect_timeout=self.connect_timeout, read_timeout=self.read_timeout,
                                   max_attempts=self.max_attempts)
        from resources.aws_credentials import CredentialProfiles, Timeouts  # imports dagster: only when needed

        registry = CredentialProfiles.shared({p.name: p for p in self.profiles})
        timeouts = Timeouts(self.connect_timeout, self.read_timeout, self.max_attempts)
        client: S3Client = registry.client("s3", self.credentials, component=component, region=self.region,
                                           endpoint_url=self.endpoint_url, path_style=self.path_style,
                                           timeouts=timeouts)
        return client

    def frozen_credentials(self) -> ReadOnlyCredentials | None:
        """The credentials this connection signs with now, for an S3 client that is not boto3's (Arrow's);
        None when the process has none (Arrow then tries its own default chain)."""
        if self.credentials:
            from resources.aws_credentials import CredentialProfiles

            registry = CredentialProfiles.shared({p.name: p for p in self.profiles})
            session = registry.session(self.credentials, component=f"s3 connection as {self.credentials!r}")
        else:
            session = boto3.session.Session()
        credentials = session.get_credentials()
        return None if credentials is None else credentials.get_frozen_credentials()


class _BodyReader(io.RawIOBase):
    """A raw stream over a GetObject body whose transport errors surface as DestinationError."""

    def __init__(self, body: StreamingBody, where: str) -> None:
        super().__init__()
        self._body = body
        self._where = where

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        try:
            data = self._body.read(len(view))
        except BotoCoreError as exc:
            raise DestinationError(f"s3 read {self._where} failed: {_describe(exc)}") from exc
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


class S3Destination:
    """Objects in `bucket` under `prefix`; artifacts stream, the manifest is swapped conditionally."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        region: str | None = None,
        endpoint_url: str | None = None,
        path_style: bool = False,
        client: S3Client | None = None,
        multipart_threshold: int = 8 * MiB,
        part_size: int = 8 * MiB,
        name: str = "s3",
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_attempts: int = 5,
        cas_attempts: int = 6,
        credentials: str = "",
        profiles: Sequence[CredentialProfile] = (),
    ) -> None:
        if not bucket:
            raise ValueError("S3Destination needs a bucket")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size {part_size} is below S3's minimum part size {MIN_PART_SIZE}")
        if multipart_threshold < 0 or cas_attempts < 1:
            raise ValueError("multipart_threshold must be >= 0 and cas_attempts >= 1")
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint_url = endpoint_url
        self.name = name
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.cas_attempts = cas_attempts
        if client is not None:  # a client made elsewhere (the `s3` resource): tasks must reach the same endpoint
            region, endpoint_url, path_style = _client_settings(client, region, endpoint_url, path_style)
        self.connection = S3Connection(region, endpoint_url, path_style, connect_timeout, read_timeout, max_attempts,
                                       credentials, tuple(profiles))
        self._client = client or self.connection.client(f"s3 destination s3://{bucket}/{prefix}")

    def __repr__(self) -> str:
        return f"S3Destination(bucket={self.bucket!r}, prefix={self.prefix!r}, name={self.name!r})"

    # -- public API ---------------------------------------------------------------------------

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._full(key)}"

    def put(self, key: str, stream: BinaryIO | bytes) -> PutResult:
        """put_object up to `multipart_threshold` bytes, else a streamed multipart upload.

        At most `multipart_threshold + part_size` bytes are held in memory, whatever the object size.
        """
        full, reader = self._full(key), _as_stream(stream)
        head = _read_full(reader, self.multipart_threshold + 1)
        with self._errors("put", key):
            if len(head) <= self.multipart_threshold:
                etag = self._client.put_object(Bucket=self.bucket, Key=full, Body=head)["ETag"]
                return PutResult(uri=self.uri(key), size=len(head), revision=etag)
            etag, size = self._put_multipart(full, _parts(head, reader, self.part_size))
        return PutResult(uri=self.uri(key), size=size, revision=etag)

    def get(self, key: str) -> GetResult | None:
        with self._errors("get", key):
            response = self._get_object_or_none(key)
            if response is None:
                return None
            with contextlib.closing(response["Body"]) as body:
                return GetResult(data=body.read(), revision=response["ETag"])

    def open_read(self, key: str) -> BinaryIO:
        """A buffered stream over the object body; FileNotFoundError when it does not exist."""
        with self._errors("open_read", key):
            response = self._get_object_or_none(key)
        if response is None:
            raise FileNotFoundError(f"no object {self.uri(key)}")
        return io.BufferedReader(_BodyReader(response["Body"], self.uri(key)), buffer_size=MiB)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """GetObject with `Range: bytes=start-end`: only those bytes cross the network. A start past
        the object's end (416 InvalidRange) reads nothing."""
        check_range(start, length)
        if not length:
            return b""
        with self._errors("read_range", key):
            try:
                response = self._client.get_object(Bucket=self.bucket, Key=self._full(key),
                                                   Range=f"bytes={start}-{start + length - 1}")
            except ClientError as exc:
                if _is_missing(exc):
                    raise FileNotFoundError(f"no object {self.uri(key)}") from None
                if _error_code(exc) == "InvalidRange":
                    return b""
                raise
            with contextlib.closing(response["Body"]) as body:
                return body.read()

    def put_if(self, key: str, data: bytes, expected_revision: str | None) -> str:
        """Conditional PUT (`If-None-Match: *` to create, `If-Match: <etag>` to replace).

        412 -> CASConflict; 409 ConditionalRequestConflict -> retried with backoff; ambiguous
        failures are resolved by re-reading (see the module doc). Bounded by `cas_attempts`.
        """
        return _ConditionalPut(self, key, data, expected_revision).run()

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Keys relative to the destination prefix, in S3's (lexicographic UTF-8) listing order.

        General purpose buckets list in key order; S3 Express directory buckets do not and are
        not supported.
        """
        return self._list(prefix)

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=self._full(key))

    def presigned_get(self, key: str, expires_s: int) -> str:
        """A URL that GETs `key` without credentials for `expires_s` seconds (SigV4 query signing, as
        this destination's client signs: its credentials profile, whose own expiry also ends the URL)."""
        with self._errors("presign", key):
            url: str = self._client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._full(key)}, ExpiresIn=expires_s)
        return url

    def begin_multipart(self, key: str) -> S3Upload:
        """CreateMultipartUpload for `key`; the handle rebuilds its client from `connection` in a task."""
        from resources.destinations.s3_multipart import S3Upload

        with self._errors("begin multipart", key):
            upload_id = self._client.create_multipart_upload(Bucket=self.bucket, Key=self._full(key))["UploadId"]
        return S3Upload(self.bucket, self.prefix, key, upload_id, self.connection, _client=self._client)

    def abort_stale_uploads(self, prefix: str, older_than_s: float) -> tuple[str, ...]:
        """ListMultipartUploads under the prefix; AbortMultipartUpload for those initiated before the cutoff."""
        cutoff = time.time() - older_than_s
        aborted = []
        with self._errors("list multipart uploads", prefix):
            pages = self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket,
                                                                                 Prefix=self.prefix + prefix)
            stale = [(u["Key"], u["UploadId"]) for page in pages for u in page.get("Uploads", [])
                     if u["Initiated"].timestamp() < cutoff]
        for full, upload_id in stale:
            with self._errors("abort multipart upload", full):
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            aborted.append(full[len(self.prefix):])
        return tuple(aborted)

    # -- internals ----------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        if not isinstance(key, str) or not key:
            raise DestinationError(f"invalid key {key!r}: must be a non-empty string")
        return self.prefix + key

    def _error(self, op: str, key: str, cause: BaseException) -> DestinationError:
        """A DestinationError naming the operation, bucket, full key and cause."""
        return DestinationError(
            f"s3 {op} failed for bucket {self.bucket!r} key {self.prefix + key!r}"
            f"{f' at {self.endpoint_url}' if self.endpoint_url else ''}: {_describe(cause)}"
        )

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        try:
            yield
        except (ClientError, BotoCoreError) as exc:
            raise self._error(op, key, exc) from exc

    def _get_object_or_none(self, key: str) -> GetObjectOutputTypeDef | None:
        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as exc:
            if _is_missing(exc):
                return None
            raise

    def _put_multipart(self, full: str, parts: Iterator[bytes]) -> tuple[str, int]:
        """Upload `parts` as one object; abort the upload on any failure so no parts linger."""
        upload_id = self._client.create_multipart_upload(Bucket=self.bucket, Key=full)["UploadId"]
        try:
            completed: list[CompletedPartTypeDef] = []
            size = 0
            for number, part in enumerate(parts, start=1):
                if number > MAX_PARTS:
                    raise DestinationError(f"s3 put {full!r}: more than {MAX_PARTS} parts; raise part_size")
                response = self._client.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=part
                )
                completed.append({"ETag": response["ETag"], "PartNumber": number})
                size += len(part)
            done = self._client.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": completed}
            )
        except BaseException:
            with contextlib.suppress(ClientError, BotoCoreError):
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            raise
        return done["ETag"], size

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        paginator = self._client.get_paginator("list_objects_v2")
        with self._errors("list", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                for obj in page.get("Contents", []):
                    yield ObjectInfo(key=obj["Key"][len(self.prefix) :], size=obj["Size"])

    def _conditional_put(self, key: str, data: bytes, expected_revision: str | None) -> str:
        """One raw conditional PutObject; returns the new ETag (botocore errors propagate)."""
        full = self._full(key)
        if expected_revision is None:
            return self._client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")["ETag"]
        return self._client.put_object(Bucket=self.bucket, Key=full, Body=data, IfMatch=expected_revision)[
            "ETag"
        ]


class _ConditionalPut:
    """One `put_if` call: bounded attempts, each classified as won, lost, retry or ambiguous."""

    def __init__(self, dest: S3Destination, key: str, data: bytes, expected: str | None) -> None:
        self.dest, self.key, self.data, self.expected = dest, key, data, expected
        # Set once any attempt may have been applied without our seeing the answer; from then on
        # a 412 can be our own earlier write and must be checked, not reported as a lost race.
        self.maybe_landed = False

    def run(self) -> str:
        for attempt in range(self.dest.cas_attempts):
            if attempt:
                _backoff(attempt)
            etag = self._attempt()
            if etag is not None:
                return etag
        attempts = self.dest.cas_attempts
        raise DestinationError(
            f"s3 put_if {self.dest.uri(self.key)}: no definite outcome after {attempts} attempts"
        )

    def _attempt(self) -> str | None:
        """The new ETag, or None to try again; raises CASConflict / DestinationError when final."""
        try:
            return self.dest._conditional_put(self.key, self.data, self.expected)
        except ClientError as exc:
            return self._on_client_error(exc)
        except _AMBIGUOUS_ERRORS as exc:
            self.maybe_landed = True
            return self._resolve(exc)
        except BotoCoreError as exc:
            raise self.dest._error("put_if", self.key, exc) from exc

    def _on_client_error(self, exc: ClientError) -> str | None:
        self.maybe_landed = self.maybe_landed or _was_retried(exc)
        status = _http_status(exc)
        if status == 412 or _error_code(exc) == "PreconditionFailed" or _is_missing(exc):
            # 404 NoSuchKey: If-Match on an object that no longer exists.
            if self.maybe_landed:
                return self._resolve(exc)
            raise self._conflict(_describe(exc)) from exc
        if status == 409:  # ConditionalRequestConflict: a concurrent write is in flight; retry
            return None
        if status >= 500:
            self.maybe_landed = True
            return self._resolve(exc)
        raise self.dest._error("put_if", self.key, exc) from exc

    def _resolve(self, cause: BaseException) -> str | None:
        """Decide an uncertain attempt from the object's current state."""
        try:
            current = self.dest.get(self.key)
        except DestinationError as exc:
            raise DestinationError(
                f"s3 put_if {self.dest.uri(self.key)}: outcome unknown after {_describe(cause)}; "
                f"re-reading the object failed: {exc}"
            ) from exc
        if current is not None and current.data == self.data:
            return current.revision
        if self._is_expected_state(current):
            return None
        raise self._conflict(f"the object changed underneath ({_describe(cause)})")

    def _is_expected_state(self, current: GetResult | None) -> bool:
        if current is None or self.expected is None:
            return current is None and self.expected is None
        return _same_etag(current.revision, self.expected)

    def _conflict(self, why: str) -> CASConflict:
        return CASConflict(
            f"s3 put_if {self.dest.uri(self.key)}: expected revision {self.expected!r} does not hold: {why}"
        )
