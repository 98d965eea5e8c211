"""LocalDestination specifics: permissions, no litter, no escaping the root, a real cross-process CAS."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import stat
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from resources.destinations.base import CASConflict, DestinationError
from resources.destinations.local import LocalDestination

COUNTER_KEY = "t/counter.json"
PROCESSES = 8
ATTEMPTS = 25


@pytest.fixture
def dest(tmp_path: Path) -> LocalDestination:
    return LocalDestination(tmp_path / "root")


@pytest.fixture
def restrictive_umask() -> Iterator[None]:
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _tree(root: Path) -> list[str]:
    """Every file and directory under root, relative, sorted (to spot stray temp or lock files)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


class ExplodingStream(io.RawIOBase):
    """Yields some bytes, then fails like a broken upstream reader."""

    def __init__(self) -> None:
        self._sent = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._sent:
            raise RuntimeError("upstream broke")
        self._sent = True
        buffer[:3] = b"abc"
        return 3


def test_modes_are_0644_and_0755_under_a_restrictive_umask(
    dest: LocalDestination, restrictive_umask: None
) -> None:
    dest.put("t/epoch=1/snapshot-0_1.jsonl", b"{}\n")
    dest.put_if("m/manifest.json", b"{}", None)
    for directory in ("", "t", "t/epoch=1", "m"):
        assert _mode(dest.root / directory) == 0o755, directory
    for file in ("t/epoch=1/snapshot-0_1.jsonl", "m/manifest.json"):
        assert _mode(dest.root / file) == 0o644, file


def test_no_temp_or_lock_files_are_left_behind(dest: LocalDestination) -> None:
    dest.put("t/a.jsonl", b"a")
    rev = dest.put_if("t/manifest.json", b"1", None)
    with pytest.raises(CASConflict):
        dest.put_if("t/manifest.json", b"2", "stale")
    dest.put_if("t/manifest.json", b"2", rev)
    with pytest.raises(RuntimeError, match="upstream broke"):
        dest.put("t/broken.jsonl", ExplodingStream())  # type: ignore[arg-type]
    assert _tree(dest.root) == ["t", "t/a.jsonl", "t/manifest.json"]


def test_revision_is_the_sha256_of_the_content(dest: LocalDestination) -> None:
    put = dest.put("x.bin", b"payload")
    assert put.revision == hashlib.sha256(b"payload").hexdigest()


@pytest.mark.parametrize(
    "key", ["../escape", "a/../../escape", "/etc/passwd", "a\\b", "", "a//b", "./a", "a/", "a/.", ".~lock.x"]
)
@pytest.mark.parametrize(
    "operation",
    [
        lambda d, k: d.put(k, b"x"),
        lambda d, k: d.get(k),
        lambda d, k: d.put_if(k, b"x", None),
        lambda d, k: d.delete(k),
        lambda d, k: d.uri(k),
        lambda d, k: d.open_read(k),
    ],
    ids=["put", "get", "put_if", "delete", "uri", "open_read"],
)
def test_keys_cannot_escape_the_root(
    dest: LocalDestination, key: str, operation: Callable[[LocalDestination, str], object]
) -> None:
    with pytest.raises(DestinationError):
        operation(dest, key)
    assert not (dest.root.parent / "escape").exists()


def test_list_prefix_cannot_escape_the_root(dest: LocalDestination) -> None:
    with pytest.raises(DestinationError):
        list(dest.list("../"))


def test_uri_is_absolute_even_for_a_relative_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    dest = LocalDestination("rel")
    assert dest.uri("t/epoch=2/diff-0_1-0_2.jsonl") == f"file://{tmp_path}/rel/t/epoch=2/diff-0_1-0_2.jsonl"
    assert dest.uri("a b#c").endswith("/rel/a%20b%23c")


def test_delete_prunes_empty_directories_but_not_the_root(dest: LocalDestination) -> None:
    dest.put("t/epoch=1/a.jsonl", b"a")
    dest.put("t/keep.json", b"k")
    dest.delete("t/epoch=1/a.jsonl")
    assert _tree(dest.root) == ["t", "t/keep.json"]
    dest.delete("t/keep.json")
    assert dest.root.is_dir() and _tree(dest.root) == []


def test_internal_files_are_not_listed(dest: LocalDestination) -> None:
    dest.put("t/a.json", b"a")
    (dest.root / "t" / ".~lock.a.json").write_bytes(b"")
    (dest.root / "t" / ".~tmp.zzz").write_bytes(b"partial")
    assert [info.key for info in dest.list("")] == ["t/a.json"]


def _increment(root: str, barrier: Barrier, results: multiprocessing.Queue[int]) -> None:
    """Worker: read the counter, CAS it to +1; report how many CASes won (-1 if the worker broke)."""
    dest = LocalDestination(root)
    barrier.wait()
    wins = 0
    try:
        for _ in range(ATTEMPTS):
            current = dest.get(COUNTER_KEY)
            assert current is not None
            try:
                dest.put_if(COUNTER_KEY, b"%d" % (int(current.data) + 1), current.revision)
            except CASConflict:
                continue
            wins += 1
    except BaseException:
        results.put(-1)  # fail the test now rather than at the queue timeout
        raise
    results.put(wins)


def test_cross_process_cas_loses_no_update(dest: LocalDestination) -> None:
    """8 processes race read -> put_if(+1): every successful CAS must be counted exactly once."""
    dest.put_if(COUNTER_KEY, b"0", None)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    workers = [
        ctx.Process(target=_increment, args=(str(dest.root), barrier, results)) for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    wins = [results.get(timeout=60) for _ in workers]
    assert min(wins) >= 0, "a worker failed"
    for worker in workers:
        worker.join(timeout=10)
        assert worker.exitcode == 0
    final = dest.get(COUNTER_KEY)
    assert final is not None
    assert int(final.data) == sum(wins) > 0
    assert _tree(dest.root) == ["t", "t/counter.json"]
