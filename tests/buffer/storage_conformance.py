"""The conformance suite every `BufferStorage` runs: the properties the buffer's crash safety rests on.

Importable: `check_all(make)` runs every check against fresh storages made by `make()`, two of
which may address the same place (two processes on two hosts). The test module runs it against
the local directory, an S3 prefix on moto_server, and the object implementation over a local
destination.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from resources.buffer import BufferCorrupt, WriterLockHeld
from resources.buffer.storage import BufferStorage

MakeStorage = Callable[[], BufferStorage]


def publish_is_whole_and_no_clobber(make: MakeStorage) -> None:
    storage = make()
    storage.lock_writer()
    try:
        temp = storage.create_temp("segments/000000000001-changes.parquet")
        temp.write(b"x" * 100_000)
        assert storage.list_names("segments") == [], "a temporary is invisible"
        assert storage.publish(temp, "segments/000000000001-changes.parquet") == 100_000
        reader = make()
        assert reader.list_names("segments") == ["segments/000000000001-changes.parquet"]
        assert reader.size("segments/000000000001-changes.parquet") == 100_000
        with reader.open_read("segments/000000000001-changes.parquet") as f:
            f.seek(-10, 2)  # footers are read from the end
            assert f.read() == b"x" * 10
        again = storage.create_temp("segments/000000000001-changes.parquet")
        again.write(b"other")
        with pytest.raises((BufferCorrupt, FileExistsError)):
            storage.publish(again, "segments/000000000001-changes.parquet")
        with reader.open_read("segments/000000000001-changes.parquet") as f:
            assert f.read() == b"x" * 100_000, "a sealed segment is never replaced"
    finally:
        storage.unlock_writer()


def discard_leaves_nothing(make: MakeStorage) -> None:
    storage = make()
    temp = storage.create_temp("segments/000000000002-changes.parquet")
    temp.write(b"half a segment")
    storage.discard(temp)
    storage.remove_temporaries("segments")
    assert "segments/000000000002-changes.parquet" not in make().list_names("segments")


def write_atomic_replaces_and_read_sees_it(make: MakeStorage) -> None:
    storage = make()
    storage.lock_writer()
    try:
        assert storage.read("index.json") is None
        storage.write_atomic("index.json", b"one")
        storage.write_atomic("index.json", b"two")
        assert make().read("index.json") == b"two"
        assert make().list_names("segments") == [] or all(n.startswith("segments/") for n in
                                                          make().list_names("segments"))
    finally:
        storage.unlock_writer()


def a_reader_may_write_a_request(make: MakeStorage) -> None:
    """The release request is written by a reader (a run), not the writer: no lock is needed."""
    make().write_atomic("release.json", b'{"below": "0/1"}')
    assert make().read("release.json") == b'{"below": "0/1"}'


def delete_and_listing(make: MakeStorage) -> None:
    storage = make()
    storage.lock_writer()
    try:
        for n in (3, 4):
            temp = storage.create_temp(f"segments/00000000000{n}-changes.parquet")
            temp.write(b"s")
            storage.publish(temp, f"segments/00000000000{n}-changes.parquet")
        storage.delete("segments/000000000003-changes.parquet")
        storage.delete("segments/000000000003-changes.parquet")  # missing is fine
        names = make().list_names("segments")
        assert "segments/000000000004-changes.parquet" in names
        assert "segments/000000000003-changes.parquet" not in names
        assert names == sorted(names)
    finally:
        storage.unlock_writer()


def one_writer_at_a_time(make: MakeStorage) -> None:
    first, second = make(), make()
    first.lock_writer()
    try:
        assert make().writer_alive() is not None, "liveness is visible to anyone, without taking the lock"
        with pytest.raises(WriterLockHeld):
            second.lock_writer()
    finally:
        first.unlock_writer()
    assert make().writer_alive() is None, "a clean close frees the writer role at once"
    second.lock_writer()
    second.unlock_writer()


CHECKS = (publish_is_whole_and_no_clobber, discard_leaves_nothing, write_atomic_replaces_and_read_sees_it,
          a_reader_may_write_a_request, delete_and_listing, one_writer_at_a_time)
