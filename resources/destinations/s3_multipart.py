"""Multipart uploads on an S3 destination: parts from any host, server-side copies, completion by the driver.

The handle pickles as bucket, prefix, key, upload id and the destination's `S3Connection` (no
secret): a task on another host builds its own client from that (one per process and connection,
kept for the next task of a reused Python worker). `copy_part` is UploadPartCopy with a
CopySourceRange, so reused bytes stay inside S3. `complete` asks S3 which parts it holds
(ListParts), checks S3's rules on them (multipart.check_parts) and names what is wrong before
CompleteMultipartUpload could refuse it; the tasks need not ship their ETags back.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from botocore.exceptions import BotoCoreError, ClientError

from resources.destinations.base import DestinationError, PutResult
from resources.destinations.multipart import (
    MAX_PART_SIZE,
    CopyRange,
    MiB,
    MultipartError,
    PartData,
    PartReceipt,
    check_numbers,
    check_part_number,
    check_parts,
    check_range,
    staged_key,
    staged_prefix,
)
from resources.destinations.s3 import S3Connection, _describe, _error_code

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client
    from types_boto3_s3.type_defs import CompletedPartTypeDef, ObjectIdentifierTypeDef

_SPOOL_IN_MEMORY = 16 * MiB  # a streamed part beyond this spills to the task's own temp dir
_clients: dict[S3Connection, S3Client] = {}
_clients_lock = threading.Lock()


def _client_for(connection: S3Connection, component: str) -> S3Client:
    """The process's client for `connection` (clients are thread-safe once built; building is not)."""
    with _clients_lock:
        client = _clients.get(connection)
        if client is None:
            client = _clients[connection] = connection.client(component)
        return client


def _blob(body: PartData) -> bytes | BinaryIO:
    """`body` as boto3's stubs type a blob: botocore takes a bytearray as it is (no copy), the stubs
    only name bytes."""
    return cast(bytes, body) if isinstance(body, bytearray) else body


@dataclass
class S3Upload:
    """One S3 multipart upload; picklable (the client is left behind and rebuilt where it lands)."""

    bucket: str
    prefix: str
    key: str
    upload_id: str
    connection: S3Connection
    _client: S3Client | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def client(self) -> S3Client:
        if self._client is None:
            self._client = _client_for(self.connection, f"s3 destination s3://{self.bucket}/{self.prefix}")
        return self._client

    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}{self.key}"

    def _where(self, number: int | None = None) -> str:
        return f"s3 multipart {self.uri()} (upload {self.upload_id})" + (f" part {number}" if number else "")

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (ClientError, BotoCoreError) as exc:
            at = f" at {self.connection.endpoint_url}" if self.connection.endpoint_url else ""
            error = MultipartError if isinstance(exc, ClientError) and _error_code(exc) in (
                "NoSuchUpload", "InvalidRange", "InvalidPart", "InvalidPartOrder", "EntityTooSmall",
                "NoSuchKey", "InvalidArgument", "404") else DestinationError
            raise error(f"{what}{at}: {_describe(exc)}") from exc

    def write_part(self, number: int, data: PartData) -> PartReceipt:
        check_part_number(number, self._where())
        with self._body(data) as (body, size):
            if size > MAX_PART_SIZE:
                raise MultipartError(f"{self._where(number)}: {size} bytes exceed the {MAX_PART_SIZE}-byte maximum")
            with self._errors(self._where(number)):
                etag = self.client.upload_part(Bucket=self.bucket, Key=self.prefix + self.key, UploadId=self.upload_id,
                                               PartNumber=number, Body=_blob(body))["ETag"]
        return PartReceipt(number, size, etag)

    @staticmethod
    @contextlib.contextmanager
    def _body(data: PartData) -> Iterator[tuple[PartData, int]]:
        """bytes as they are (a merged part's buffer is not copied again); a stream spooled (memory,
        then the local temp dir) so its length is known."""
        if isinstance(data, bytes | bytearray):
            yield data, len(data)
            return
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY) as spool:
            while chunk := data.read(MiB):
                spool.write(chunk)
            size = spool.tell()
            spool.seek(0)
            yield spool, size  # type: ignore[misc]

    def copy_part(self, number: int, source_key: str, start: int, length: int) -> PartReceipt:
        where = f"{self._where(number)} from s3://{self.bucket}/{self.prefix}{source_key}"
        check_part_number(number, self._where())
        check_range(start, length, where)
        with self._errors(where):
            # Checked here, not left to S3: some S3-compatible stores copy a short range silently.
            size = self.client.head_object(Bucket=self.bucket, Key=self.prefix + source_key)["ContentLength"]
            if start + length > size:
                raise MultipartError(f"{where}: bytes {start}..{start + length} are beyond its {size} bytes")
            response = self.client.upload_part_copy(
                Bucket=self.bucket, Key=self.prefix + self.key, UploadId=self.upload_id, PartNumber=number,
                CopySource={"Bucket": self.bucket, "Key": self.prefix + source_key},
                CopySourceRange=f"bytes={start}-{start + length - 1}")
        return PartReceipt(number, length, response["CopyPartResult"]["ETag"])

    def read_range(self, source_key: str, start: int, length: int) -> bytes:
        where = f"s3 read s3://{self.bucket}/{self.prefix}{source_key}"
        check_range(start, length, where)
        with self._errors(where):
            response = self.client.get_object(Bucket=self.bucket, Key=self.prefix + source_key,
                                              Range=f"bytes={start}-{start + length - 1}")
            with contextlib.closing(response["Body"]) as body:
                data = body.read()
        if len(data) != length:
            raise MultipartError(f"{where}: asked for bytes {start}..{start + length}, got {len(data)} bytes "
                                 f"(the object holds {response.get('ContentRange', '?')})")
        return data

    def stage(self, name: str, data: bytes) -> CopyRange:
        key = staged_key(self.key, self.upload_id, name)
        with self._errors(f"{self._where()} staging {name}"):
            self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)
        return CopyRange(key, 0, len(data))

    def _drop_staged(self) -> None:
        prefix = self.prefix + staged_prefix(self.key, self.upload_id)
        with self._errors(f"{self._where()} dropping staged objects"):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                keys: list[ObjectIdentifierTypeDef] = [{"Key": item["Key"]} for item in page.get("Contents", [])]
                if keys:
                    self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})

    def _listed(self) -> dict[int, dict[str, Any]]:
        """Every part S3 holds for this upload, by number."""
        parts: dict[int, dict[str, Any]] = {}
        with self._errors(self._where()):
            pages = self.client.get_paginator("list_parts").paginate(
                Bucket=self.bucket, Key=self.prefix + self.key, UploadId=self.upload_id)
            for page in pages:
                for part in page.get("Parts", []):
                    parts[int(part["PartNumber"])] = dict(part)
        return parts

    def complete(self, numbers: Sequence[int], *, revision: bool = True) -> PutResult:
        """`MultipartUpload.complete`; the ETag comes with the completion, so `revision` changes nothing."""
        where = self._where()
        if not numbers:
            return self._complete_empty()
        check_numbers(numbers, where)
        listed = self._listed()
        missing = [n for n in numbers if n not in listed]
        if missing:
            raise MultipartError(f"{where}: parts {missing[:10]} were never written")
        check_parts([(n, int(listed[n]["Size"])) for n in numbers], where)
        # A part's checksum goes back with its ETag: S3 requires it when the upload carries checksums.
        completed = [cast("CompletedPartTypeDef", {"PartNumber": n, **{
            k: v for k, v in listed[n].items() if k == "ETag" or k.startswith("Checksum")}}) for n in numbers]
        with self._errors(where):
            done = self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=self.prefix + self.key, UploadId=self.upload_id,
                MultipartUpload={"Parts": completed})
        self._drop_staged()
        return PutResult(uri=self.uri(), size=sum(int(listed[n]["Size"]) for n in numbers), revision=done["ETag"])

    def _complete_empty(self) -> PutResult:
        """S3 refuses a multipart upload of no parts; an empty artifact is an empty object all the same."""
        self.abort()
        with self._errors(self._where()):
            etag = self.client.put_object(Bucket=self.bucket, Key=self.prefix + self.key, Body=b"")["ETag"]
        return PutResult(uri=self.uri(), size=0, revision=etag)

    def abort(self) -> None:
        self._drop_staged()
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.prefix + self.key, UploadId=self.upload_id)
        except ClientError as exc:
            if _error_code(exc) != "NoSuchUpload":
                raise DestinationError(f"{self._where()}: abort failed: {_describe(exc)}") from exc
        except BotoCoreError as exc:
            raise DestinationError(f"{self._where()}: abort failed: {_describe(exc)}") from exc
