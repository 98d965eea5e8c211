"""The reader side is read only by construction: its commands run with credentials that can only read.

A Spark-built archive (key index included) is uploaded to a moto_server of this module, IAM is
enforced, and each reader command runs as its own `snapshotter` process signed by a user whose only
policy allows s3:GetObject and s3:ListBucket (get, reconstruct, inspect, verify). The commands must
answer correctly, the endpoint's recording must show that user sent nothing but reads, and the same
credentials must be refused a write (so the test would catch a reader that tried one).
`READ_COMMANDS` lists the commands (one entry each): get, reconstruct, inspect, verify, and
bootstrap, which presigns its URLs locally and reads only the manifest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from snapshot_assets.archive.key_index import index_key
from snapshot_assets.archive.keys import typed_key
from snapshot_assets.archive.reader import ArchiveReader
from tests.aws.conftest import Moto, credential_of, start_moto
from tests.aws.support import bucket, client
from tests.spark.conftest import spark  # noqa: F401 - the Spark session that builds the archive
from tests.spark.lookup_support import BIG, INT_COLUMNS, PREFIX, Built, build_archive, int_row

pytestmark = [pytest.mark.s3, pytest.mark.slow]
SNAPSHOTTER = str(Path(sys.executable).with_name("snapshotter"))
READ_ONLY_ACTIONS = ["s3:GetObject", "s3:ListBucket"]


@dataclass
class ReadOnlyStore:
    """An archive in S3 and the environment of a process that may only read it."""

    moto: Moto
    bucket: str
    env: dict[str, str]
    key_id: str
    built: Built
    config: Path  # a configuration naming the archive, for the commands that take one (bootstrap)

    def store_args(self) -> list[str]:
        return ["--store", "s3", "--bucket", self.bucket, "--endpoint-url", self.moto.url, "--path-style",
                "--region", "us-east-1", "--key-prefix", PREFIX]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SNAPSHOTTER, *args], env=self.env, capture_output=True, text=True, timeout=300,
                              check=False)

    def methods_signed_by_reader(self) -> set[str]:
        """HTTP methods of every request the read-only user signed (the endpoint's own record)."""
        return {entry["method"] for entry in self.moto.requests()
                if (credential_of(entry) or ("", ""))[0] == self.key_id}


@pytest.fixture(scope="module")
def read_only_store(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadOnlyStore]:  # noqa: F811
    work = tmp_path_factory.mktemp("read-only")
    built = build_archive(spark, work, "public.events", INT_COLUMNS, int_row, 800, 8 * 1024)
    moto = start_moto(work, record=True)
    try:
        name = bucket(moto.url)
        s3 = client("s3", moto.url)
        root = built.dest.root
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            s3.put_object(Bucket=name, Key=path.relative_to(root).as_posix(), Body=path.read_bytes())
        iam = client("iam", moto.url)
        iam.create_user(UserName="archive-reader")
        iam.put_user_policy(UserName="archive-reader", PolicyName="read", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": READ_ONLY_ACTIONS, "Resource": "*"}]}))
        key = iam.create_access_key(UserName="archive-reader")["AccessKey"]
        moto.enforce_iam()
        env = {**os.environ, "AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        env.pop("AWS_SESSION_TOKEN", None)
        config = work / "reader.conf"
        destination = {"type": "s3", "bucket": name, "prefix": "", "endpoint_url": moto.url, "path_style": True,
                       "region": "us-east-1"}
        config.write_text(f"""snapshotter {{
          source {{ type = generator, table = events }}
          key_prefix = "{PREFIX}"
          destinations = [ {json.dumps(destination)} ]
          buffer.path = "{work / 'reader-buffer'}"
        }}""")
        yield ReadOnlyStore(moto, name, env, key["AccessKeyId"], built, config)
    finally:
        moto.stop()


def _check_get(store: ReadOnlyStore, proc: subprocess.CompletedProcess[str]) -> None:
    doc = json.loads(proc.stdout)
    rec = store.built.reader().reconstruct_as_of(store.built.positions[2])
    assert rec is not None
    want = {typed_key(r, ("id",)): r for r in rec.rows}.get((BIG + 700,))
    assert doc["row"] == want and doc["found"]
    assert "key index + one range" in proc.stderr  # the ranged path, not the scan


def _check_reconstruct(store: ReadOnlyStore, proc: subprocess.CompletedProcess[str]) -> None:
    doc = json.loads(proc.stdout)
    rec = store.built.reader().reconstruct_as_of(store.built.positions[2])
    assert rec is not None and doc["position"] == rec.position
    by_key = {typed_key(r, ("id",)): r for r in doc["rows"]}
    assert by_key == {typed_key(r, ("id",)): r for r in rec.rows}


def _check_bootstrap(store: ReadOnlyStore, proc: subprocess.CompletedProcess[str]) -> None:
    doc = json.loads(proc.stdout)
    assert doc["head_position"] == store.built.positions[4]
    urls = [ref["url"] for art in doc["artifacts"] for ref in art["formats"].values()]
    assert urls and all(u.startswith(store.moto.url) and "X-Amz-Signature=" in u for u in urls)


def _assert(condition: bool) -> None:
    assert condition


#: Every reader command: its arguments after the store flags, and what its answer must be.
READ_COMMANDS: dict[str, tuple[Callable[[ReadOnlyStore], list[str]], Callable[[ReadOnlyStore, Any], None]]] = {
    "get": (lambda s: ["get", *s.store_args(), "--key", str(BIG + 700), "--at", s.built.positions[2], "--verbose"],
            _check_get),
    "reconstruct": (lambda s: ["reconstruct", *s.store_args(), "--at", s.built.positions[2]], _check_reconstruct),
    "inspect": (lambda s: ["inspect", *s.store_args()], lambda s, proc: _assert(s.built.positions[4] in proc.stdout)),
    "verify": (lambda s: ["verify", *s.store_args(), "--deep"], lambda s, proc: _assert("ok:" in proc.stdout)),
    "bootstrap": (lambda s: ["bootstrap", "--config", str(s.config), "--table", "public.events"], _check_bootstrap),
}


@pytest.mark.parametrize("command", sorted(READ_COMMANDS))
def test_reader_commands_work_with_read_only_credentials(read_only_store: ReadOnlyStore, command: str) -> None:
    args, check = READ_COMMANDS[command]
    proc = read_only_store.run(*args(read_only_store))
    assert proc.returncode == 0, proc.stderr
    check(read_only_store, proc)
    methods = read_only_store.methods_signed_by_reader()
    assert methods and methods <= {"GET", "HEAD"}, methods


def test_the_read_only_credentials_cannot_write(read_only_store: ReadOnlyStore) -> None:
    """The control: the same credentials are refused a write, so a reader that wrote would fail above."""
    s3 = client("s3", read_only_store.moto.url, aws_access_key_id=read_only_store.env["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=read_only_store.env["AWS_SECRET_ACCESS_KEY"])
    key = index_key(PREFIX, 1, read_only_store.built.positions[0])
    assert s3.get_object(Bucket=read_only_store.bucket, Key=key)["Body"].read()
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.put_object(Bucket=read_only_store.bucket, Key=key, Body=b"{}")
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.delete_object(Bucket=read_only_store.bucket, Key=key)
    reader = ArchiveReader(read_only_store.built.dest, PREFIX)
    assert reader.load_manifest().head_position == read_only_store.built.positions[4]
