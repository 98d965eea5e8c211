"""What each multipart implementation promises beyond the shared suite: where bytes go, and where they do not."""

from __future__ import annotations

import base64
import errno
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import pytest

from resources.aws_credentials import CredentialProfiles
from resources.destinations.base import DestinationError
from resources.destinations.factory import build_destination
from resources.destinations.local import LocalDestination
from resources.destinations.local_multipart import STAGING_DIR
from resources.destinations.multipart import CopyRange, begin, plan_parts, write_planned
from resources.destinations.s3 import MiB, S3Destination
from tests.aws.conftest import Moto, start_moto
from tests.aws.support import bucket, s3_dest, table
from tests.aws.test_credentials import profile, role


def _blob(size: int) -> bytes:
    return os.urandom(size)


# -- local ------------------------------------------------------------------------------------------


def test_local_parts_stage_under_the_root_out_of_sight_and_leave_nothing_behind(tmp_path: Path) -> None:
    dest = LocalDestination(tmp_path / "root")
    upload = begin(dest, "t/a.bin")
    upload.write_part(1, b"abc")
    staged = list((tmp_path / "root" / STAGING_DIR).rglob("part-*"))
    assert [p.name for p in staged] == ["part-00001"] and list(dest.list("")) == []
    upload.complete([1])
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["t"]  # staging gone


def test_local_falls_back_to_a_buffered_copy_where_the_kernel_refuses(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> int:
        raise OSError(errno.EXDEV, "cross-device copy not supported")

    dest = LocalDestination(tmp_path / "root")
    old = _blob(6 * MiB)
    dest.put("old.bin", old)
    monkeypatch.setattr(os, "copy_file_range", refuse)
    upload = begin(dest, "new.bin")
    upload.copy_part(1, "old.bin", MiB, 5 * MiB)
    upload.write_part(2, b"tail")
    upload.complete([1, 2])
    got = dest.get("new.bin")
    assert got is not None and got.data == old[MiB:] + b"tail"


def test_local_a_copied_range_is_a_link_to_its_source_and_is_written_once_into_the_object(tmp_path: Path) -> None:
    dest = LocalDestination(tmp_path / "root")
    old = _blob(7 * MiB)
    dest.put("old.bin", old)
    upload = begin(dest, "new.bin")
    assert upload.copy_part(1, "old.bin", MiB, 5 * MiB).size == 5 * MiB
    staged = list((tmp_path / "root" / STAGING_DIR).rglob("part-*"))
    assert [p.name for p in staged] == [f"part-00001@{MiB}+{5 * MiB}"]
    assert staged[0].stat().st_ino == dest.path("old.bin").stat().st_ino  # no bytes were copied yet
    dest.put("old.bin", b"replaced")  # as with S3's UploadPartCopy, the part keeps the bytes it was asked for
    upload.write_part(2, b"tail")
    upload.complete([1, 2])
    got = dest.get("new.bin")
    assert got is not None and got.data == old[MiB:6 * MiB] + b"tail"
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["new.bin", "old.bin"]  # staging gone


def test_local_a_part_number_written_again_keeps_only_the_latest_kind(tmp_path: Path) -> None:
    dest = LocalDestination(tmp_path / "root")
    old = _blob(6 * MiB)
    dest.put("old.bin", old)
    upload = begin(dest, "new.bin")
    upload.write_part(1, b"x" * (5 * MiB))
    upload.copy_part(1, "old.bin", 0, 5 * MiB)  # a retried attempt that copies instead
    upload.copy_part(2, "old.bin", 5 * MiB, MiB)
    upload.write_part(2, b"last")  # and one that writes instead of copying
    upload.complete([1, 2])
    got = dest.get("new.bin")
    assert got is not None and got.data == old[:5 * MiB] + b"last"


def test_local_copies_the_range_where_the_filesystem_refuses_links(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise OSError(errno.EXDEV, "links not supported")

    dest = LocalDestination(tmp_path / "root")
    old = _blob(6 * MiB)
    dest.put("old.bin", old)
    monkeypatch.setattr(os, "link", refuse)
    upload = begin(dest, "new.bin")
    upload.copy_part(1, "old.bin", MiB, 5 * MiB)
    assert [p.name for p in (tmp_path / "root" / STAGING_DIR).rglob("part-*")] == ["part-00001"]
    upload.complete([1])
    got = dest.get("new.bin")
    assert got is not None and got.data == old[MiB:]


def test_local_rejects_a_key_that_could_escape_the_root_at_begin(tmp_path: Path) -> None:
    with pytest.raises(DestinationError, match=r"'\.\.' components are not allowed"):
        begin(LocalDestination(tmp_path / "root"), "../outside.bin")


_MERGE_MANY_PARTS = """
import os, sys
from pathlib import Path
from resources.destinations.local import LocalDestination
from resources.destinations.multipart import MiB, begin, plan_parts, write_plan

def peak() -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")) * 1024

upload = begin(LocalDestination(Path(sys.argv[1])), "merged.parquet")
pieces = [upload.stage(f"piece-{i:05d}", os.urandom(4 * MiB + 512 * 1024)) for i in range(32)]
plan = plan_parts(pieces)
assert len(plan) == 16 and all(len(part.segments) == 2 for part in plan)
before = peak()
write_plan(upload, plan, threads=8)
print(peak() - before)
"""


def test_merging_many_small_pieces_grows_the_process_by_a_few_parts_not_by_one_per_thread(tmp_path: Path) -> None:
    """Measured as the process's peak RSS (in a process of its own), since what kept the memory was
    not Python objects but glibc's per-thread arenas: eight threads merging 9 MiB parts grew a
    process by about 110 MiB even when only two merged at once."""
    out = subprocess.run([sys.executable, "-c", _MERGE_MANY_PARTS, str(tmp_path / "root")], check=True,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    grown = int(out.stdout.strip())
    assert grown < 60 * MiB, f"the process grew by {grown / MiB:.0f} MiB while merging"


# -- S3 ---------------------------------------------------------------------------------------------


@pytest.fixture
def recorded_moto(tmp_path: Path, aws_test_credentials: None) -> Iterator[Moto]:
    moto = start_moto(tmp_path, record=True)
    try:
        yield moto
    finally:
        moto.stop()


def _requests(moto: Moto) -> list[dict[str, object]]:
    return moto.requests()


@pytest.mark.s3
def test_s3_reused_ranges_never_pass_through_the_client(recorded_moto: Moto) -> None:
    """A re-base of unchanged buckets: every byte is copied inside S3; the client sends none and reads none."""
    client = boto3.client("s3", endpoint_url=recorded_moto.url)
    client.create_bucket(Bucket="archive")
    old = _blob(18 * MiB)
    client.put_object(Bucket="archive", Key="t/snapshot-old.jsonl", Body=old)
    recorded_moto.recording.write_text("")  # record only what the upload sends

    dest = S3Destination("archive", endpoint_url=recorded_moto.url, path_style=True)
    pieces = [CopyRange("t/snapshot-old.jsonl", 0, 6 * MiB), CopyRange("t/snapshot-old.jsonl", 7 * MiB, 11 * MiB)]
    plan = plan_parts(pieces)
    upload = begin(dest, "t/snapshot-new.jsonl")
    for part in plan:
        write_planned(upload, part)
    upload.complete([p.number for p in plan])

    sent = [r for r in _requests(recorded_moto) if "moto-api" not in str(r["url"])]
    body_bytes = sum(len(base64.b64decode(str(r["body"]))) if r["body_encoded"] else len(str(r["body"] or ""))
                     for r in sent)
    urls = [(r["method"], urlsplit(str(r["url"]))) for r in sent]
    object_reads = [u for method, u in urls  # GET bucket/key: an object's bytes (not a listing, not ListParts)
                    if method == "GET" and "/" in u.path.strip("/") and "uploadId" not in u.query]
    copies = [r for r in sent if "x-amz-copy-source" in {str(h).lower() for h in r["headers"]}]  # type: ignore[attr-defined]
    assert [p.copy is not None for p in plan] == [True, True] and len(copies) == 2
    assert body_bytes < 4096 and object_reads == []  # only the part list of CompleteMultipartUpload
    got = client.get_object(Bucket="archive", Key="t/snapshot-new.jsonl")["Body"].read()
    assert got == old[:6 * MiB] + old[7 * MiB:]


_WRITE_IN_A_TASK = """
import pickle, sys
pickle.loads(sys.stdin.buffer.read()).write_part(1, b"written by the task")
"""


@pytest.mark.s3
@pytest.mark.slow  # the task's process imports the profile machinery (dagster) afresh: ~8 s
def test_s3_a_task_signs_as_the_destinations_profile_assumed_again_where_it_runs(recorded_moto: Moto,
                                                                                  tmp_path: Path) -> None:
    """The handle carries the profile's definition, never its credentials: the task's process assumes the role."""
    arn = role(recorded_moto.url, "archive-writer")
    name = bucket(recorded_moto.url)
    cfg = table(tmp_path, [s3_dest(name, recorded_moto.url, "archive")],
                credentials=profile("archive", arn, recorded_moto.url))
    recorded_moto.recording.write_text("")  # the role and the bucket were made by the test's own key
    dest = build_destination(cfg.destinations[0], profiles=CredentialProfiles(cfg.credentials))
    upload = begin(dest, "t/a.bin")
    shipped = pickle.dumps(upload)
    assert arn.encode() in shipped and b"testing" not in shipped
    subprocess.run([sys.executable, "-c", _WRITE_IN_A_TASK], input=shipped, check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": os.getcwd()})
    upload.complete([1])
    assert dest.get("t/a.bin") is not None
    signers = recorded_moto.signers()
    s3_keys = {key for service, key in signers if service == "s3"}
    sts_calls = [key for service, key in signers if service == "sts"]
    assert s3_keys and "testing" not in s3_keys  # every S3 request, the task's too, signed as the role
    assert len(s3_keys) == len(sts_calls) == 2  # assumed once by this process, once by the task's
