"""The buffer in object storage: the storage conformance suite on every implementation, the writer
lease (takeover, fencing of a writer that lost it), and a whole buffer written and read on S3."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from resources.buffer import BufferReader, ChangeBuffer, WriterLockHeld
from resources.buffer.lease import Lease
from resources.buffer.object_storage import ObjectStorage
from resources.buffer.storage import BufferStorage, LocalStorage
from resources.destinations.base import Destination
from resources.destinations.local import LocalDestination
from resources.destinations.s3 import S3Destination
from resources.work_storage import PrefixedDestination, WorkRoot
from tests.buffer import storage_conformance
from tests.buffer.helpers import SIMPLE_SCHEMA, initial_load, lsn, tx

T = "public.t"
_names = itertools.count()


def _s3_store(bucket: str, endpoint: str) -> Destination:
    return PrefixedDestination(S3Destination(bucket, prefix="work/", endpoint_url=endpoint, path_style=True,
                                             max_attempts=2), f"buf{next(_names)}")


@pytest.fixture(params=["local-directory", "s3", "object-over-local-destination"])
def make_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], BufferStorage]:
    if request.param == "local-directory":
        return lambda: LocalStorage(tmp_path / "buf")
    if request.param == "s3":
        bucket, endpoint = request.getfixturevalue("s3_bucket"), request.getfixturevalue("moto_server")
        store = _s3_store(bucket, endpoint)
        return lambda: ObjectStorage(store, lease_seconds=5)
    local = LocalDestination(tmp_path / "dest")
    return lambda: ObjectStorage(local, lease_seconds=5)


@pytest.mark.parametrize("check", storage_conformance.CHECKS, ids=lambda c: c.__name__)
def test_buffer_storage_conformance(check: Callable[[Callable[[], BufferStorage]], None],
                                    make_storage: Callable[[], BufferStorage]) -> None:
    check(make_storage)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_an_expired_lease_is_taken_over_and_its_old_holder_is_fenced(tmp_path: Path) -> None:
    store, clock = LocalDestination(tmp_path), Clock()
    first, second = Lease(store, "lease", duration=30, clock=clock), Lease(store, "lease", duration=30, clock=clock)
    first.acquire()
    first._stop.set()  # a holder that stopped renewing (paused, partitioned) but does not know it yet
    holder = second.try_acquire()
    assert holder is not None and holder.owner == first.owner
    clock.now += 31
    assert second.try_acquire() is None, "taken over after expiry"
    with pytest.raises(WriterLockHeld, match="ran out"):
        first.assert_held()
    second.release()


def test_a_writer_that_lost_its_lease_cannot_overwrite_its_successors_index(s3_bucket: str,
                                                                           moto_server: str) -> None:
    store = _s3_store(s3_bucket, moto_server)
    old = ObjectStorage(store, lease_seconds=3)
    old.lock_writer()
    old.write_atomic("index.json", b"old writer")
    old.lease._stop.set()  # stops renewing, as a process frozen for longer than the lease would
    deadline = time.monotonic() + 15
    new = ObjectStorage(store, lease_seconds=3)
    while True:
        try:
            new.lock_writer()
            break
        except WriterLockHeld:
            assert time.monotonic() < deadline, "the successor never took over"
            time.sleep(0.5)
    new.read("index.json")
    new.write_atomic("index.json", b"new writer")
    old.lease._expires_at = time.time() + 60  # even a writer whose clock says it still holds the lease
    with pytest.raises(WriterLockHeld):
        old.write_atomic("index.json", b"zombie")
    assert ObjectStorage(store).read("index.json") == b"new writer"
    new.unlock_writer()


def test_a_whole_buffer_on_s3_reads_back_like_a_local_one(s3_bucket: str, moto_server: str, tmp_path: Path) -> None:
    def fill(make: Callable[[], BufferStorage]) -> BufferReader:
        with ChangeBuffer(tmp_path, T, seal_interval=3600.0, storage=make()) as buf:
            for event in initial_load(SIMPLE_SCHEMA, lsn(100), [{"id": 0, "v": "a"}]):
                buf.append(event)
            for p in (200, 300, 400):
                for event in tx(lsn(p), p, p + 1):
                    buf.append(event)
                buf.seal()
        return BufferReader(tmp_path, T, storage=make())

    work = WorkRoot.open(f"s3://{s3_bucket}/work", {"endpoint_url": moto_server, "path_style": True})
    on_s3 = fill(lambda: ObjectStorage(work.part(T), lease_seconds=5))
    local = fill(lambda: LocalStorage(tmp_path / "local"))
    assert on_s3.durable_position() == local.durable_position() == lsn(400)
    assert on_s3.stats(lsn(100)).changes == local.stats(lsn(100)).changes == 6
    segments = on_s3.all_segments()
    assert [s.path.startswith(f"s3://{s3_bucket}/work/{T}/segments/") for s in segments] == [True] * len(segments)
    with ChangeBuffer(tmp_path, T, storage=ObjectStorage(work.part(T), lease_seconds=5)) as again:
        assert again.durable_position() == lsn(400) and not again.recovery.rebuilt
