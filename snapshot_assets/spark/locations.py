"""Where a build keeps its working data: a local folder or an S3 prefix, the same calls for both.

Why: on a cluster the driver and the executors share no disk, so a build's inputs and outputs (the
state's bucket files and marker, each diff's delta, scratch datasets) are named by a `Location`: a
local path or `s3://bucket/prefix/`, plus the `S3Connection` its requests are signed with (no
secret: each host signs with its own credentials, see resources/destinations/s3.py). A Location is
plain picklable data, so the same value travels into the tasks.

Who touches what: the driver reads and writes the small JSON markers (`read_json` / `write_json`:
a rename into place locally, one PutObject on S3, both atomic) and clears folders; tasks open
files through `filesystem()` (Arrow's local or S3 filesystem, built in the task on its host), and
Spark reads and writes datasets through remote_io (Spark's own reader and writer for a local
path, the tasks themselves for S3: this Spark has no hadoop-aws).

`/` joins names as `pathlib.Path` does, so code that builds scratch paths works on either.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pyarrow import fs as pafs

from resources.destinations.s3 import S3Connection
from snapshot_assets.spark.remote_io import (
    RemoteIOError,
    S3Location,
    arrow_s3,
    arrow_schema_of,
    clear_prefix,
    is_s3,
    read_parquet,
    write_parquet,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession



@dataclass(frozen=True, slots=True)
class Location:
    """A folder: a local path or `s3://bucket/prefix` (no trailing slash), and how S3 is reached."""

    uri: str
    s3: S3Connection | None = None

    @classmethod
    def of(cls, where: Location | Path | str, s3: S3Connection | None = None) -> Location:
        """`where` as a Location (a Path or string is a local path or an s3 URI signed by `s3`)."""
        if isinstance(where, Location):
            return where
        text = str(where)
        if is_s3(text):
            parts = urlsplit(text)
            if not parts.netloc:
                raise RemoteIOError(f"{text!r}: an s3 URI needs a bucket (s3://bucket/prefix)")
            return cls(text.rstrip("/"), s3 or S3Connection())
        if "://" in text:
            raise RemoteIOError(f"{text!r}: a build location is a local path or an s3:// URI")
        return cls(text, None)

    @property
    def remote(self) -> bool:
        return is_s3(self.uri)

    def __truediv__(self, name: str) -> Location:
        return Location(f"{self.uri}/{name}" if self.remote else str(Path(self.uri) / name), self.s3)

    def __str__(self) -> str:
        return self.uri

    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> Location:
        if not self.remote:
            return Location(str(Path(self.uri).resolve().parent), None)
        head, _, _ = self.uri.rstrip("/").rpartition("/")
        if head in ("s3:", "s3:/"):
            raise RemoteIOError(f"{self.uri}: a bucket has no parent folder")
        return Location(head, self.s3)

    @property
    def path(self) -> Path:
        """The local folder (RemoteIOError for an S3 location: only a local runtime may ask)."""
        if self.remote:
            raise RemoteIOError(f"{self.uri} is in S3, not a local folder")
        return Path(self.uri)

    def _s3(self) -> S3Location:
        return S3Location.parse(self.uri, self.s3)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """Arrow's filesystem for this location and the folder's path in it (built where it is called:
        in a task, with that host's credentials)."""
        if not self.remote:
            return pafs.LocalFileSystem(), str(Path(self.uri).absolute())
        where = self._s3()
        return arrow_s3(where.connection), f"{where.bucket}/{where.prefix}".rstrip("/")

    def read_json(self, name: str) -> Any:
        """The JSON document `name` in this folder, or None when there is none (driver side)."""
        if not self.remote:
            try:
                return json.loads((Path(self.uri) / name).read_text())
            except FileNotFoundError:
                return None
        where = self._s3()
        client = where.connection.client(f"build location {self.uri}")
        try:
            body = client.get_object(Bucket=where.bucket, Key=where.prefix + name)["Body"]
        except client.exceptions.NoSuchKey:
            return None
        with body:
            return json.loads(body.read())

    def write_json(self, name: str, document: Any) -> None:
        """Replace `name` with `document` atomically: readers see the old or the new one, never a mix."""
        data = json.dumps(document)
        if not self.remote:
            folder = Path(self.uri)
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{name}.tmp"
            tmp.write_text(data)
            tmp.replace(folder / name)
            return
        where = self._s3()
        client = where.connection.client(f"build location {self.uri}")
        client.put_object(Bucket=where.bucket, Key=where.prefix + name, Body=data.encode())

    def make(self) -> Location:
        """Create the folder (a no-op on S3, where folders are prefixes); returns self."""
        if not self.remote:
            Path(self.uri).mkdir(parents=True, exist_ok=True)
        return self

    def clear(self) -> None:
        """Delete the folder and everything in it."""
        if not self.remote:
            shutil.rmtree(self.uri, ignore_errors=True)
            return
        clear_prefix(self._s3())

    def list_files(self, suffix: str = "") -> list[str]:
        """Names of the files directly in the folder (not dot- or underscore-prefixed), sorted."""
        if not self.remote:
            folder = Path(self.uri)
            if not folder.is_dir():
                return []
            return sorted(p.name for p in folder.iterdir()
                          if p.is_file() and p.name.endswith(suffix) and not p.name.startswith((".", "_")))
        where = self._s3()
        client = where.connection.client(f"build location {self.uri}")
        names = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.prefix):
            for item in page.get("Contents", []):
                name = item["Key"][len(where.prefix):]
                if "/" not in name and name.endswith(suffix) and not name.startswith((".", "_")):
                    names.append(name)
        return sorted(names)

    def folders(self) -> list[str]:
        """Names of the folders directly in this one, sorted."""
        if not self.remote:
            folder = Path(self.uri)
            return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        where = self._s3()
        client = where.connection.client(f"build location {self.uri}")
        names: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.prefix,
                                                                     Delimiter="/"):
            names.extend(item["Prefix"][len(where.prefix):].rstrip("/") for item in page.get("CommonPrefixes", []))
        return sorted(names)

    def delete(self, name: str) -> None:
        """Delete file `name` of this folder if it is there."""
        if not self.remote:
            (Path(self.uri) / name).unlink(missing_ok=True)
            return
        where = self._s3()
        where.connection.client(f"build location {self.uri}").delete_object(Bucket=where.bucket,
                                                                             Key=where.prefix + name)



def read_dataset(spark: SparkSession, where: Location, ddl: str | None = None) -> DataFrame:
    """The parquet dataset (a folder of files) at `where`, read as `ddl` when given (Spark's reader
    locally, the tasks in S3)."""
    if not where.remote:
        reader = spark.read.schema(ddl) if ddl else spark.read
        return reader.parquet(where.uri)
    schema = arrow_schema_of(spark, ddl) if ddl else None
    return read_parquet(spark, where.uri, s3=where.s3, schema=schema)


def write_dataset(frame: DataFrame, where: Location) -> None:
    """Replace the dataset at `where` with `frame` (Spark's writer locally, the tasks in S3)."""
    write_parquet(frame, where.uri, s3=where.s3)
