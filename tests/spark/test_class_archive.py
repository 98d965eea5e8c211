"""The local server's JVM class-data archive: written by the first server when it ends, promoted only
after a clean stop, mapped by every later server; a cut-short or unusable archive never stops a start."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapshot_assets.spark import connect_server
from snapshot_assets.spark.connect_server import (
    CLASS_ARCHIVE_ENV,
    class_archive,
    class_archive_option,
    ensure_local_connect_server,
    pyspark_home,
    server_command,
    stop_local_connect_server,
)

CONF = {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "jvm"
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, str(folder))
    return folder


def _command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_the_archive_option_and_how_a_dump_is_settled(cache: Path) -> None:
    archive = class_archive(pyspark_home())
    assert archive is not None and archive.parent == cache and archive.suffix == ".jsa"
    option, dump = class_archive_option(archive)
    assert option == f"-XX:ArchiveClassesAtExit={dump}" and dump.startswith(f"{archive}.") and dump.endswith(".part")
    Path(dump).write_bytes(b"cut short")
    connect_server._settle_dump(dump, clean=False)  # a SIGKILLed server: its file is never promoted
    assert not Path(dump).exists() and not archive.exists()
    Path(dump).write_bytes(b"whole")
    connect_server._settle_dump(dump, clean=True)
    assert archive.read_bytes() == b"whole" and not Path(dump).exists()
    assert class_archive_option(archive) == (f"-XX:SharedArchiveFile={archive}", "")
    # the user's own driver JVM options are kept
    cmd = server_command(1, {**CONF, "spark.driver.extraJavaOptions": "-Dmine=1"}, java_option="-XX:Foo")
    assert any(c.startswith("spark.driver.extraJavaOptions=") and c.endswith(" -Dmine=1 -XX:Foo") for c in cmd)


def test_the_first_server_writes_the_archive_and_the_next_one_maps_it(tmp_path: Path, cache: Path) -> None:
    state = tmp_path / "sc"
    archive = class_archive(pyspark_home())
    assert archive is not None
    try:
        first, started = ensure_local_connect_server(state, conf=CONF, idle_timeout_s=0)
        assert started and first.class_dump.endswith(".part")
        assert f"-XX:ArchiveClassesAtExit={first.class_dump}" in _command_line(first.pid)
        assert not archive.exists()
    finally:
        stop_local_connect_server(state)  # SIGTERM: the JVM writes the archive as it ends
    assert archive.is_file() and not list(cache.glob("*.part"))
    try:
        second, started = ensure_local_connect_server(state, conf=CONF, idle_timeout_s=0)
        assert started and second.class_dump == ""
        assert f"-XX:SharedArchiveFile={archive}" in _command_line(second.pid)
        assert connect_server._maps(second.pid, archive) is True  # the JVM uses it
        assert "shared archive" not in Path(second.log_path).read_text(errors="replace").lower()
    finally:
        stop_local_connect_server(state)


def test_an_unusable_archive_does_not_stop_the_server_from_starting(tmp_path: Path, cache: Path) -> None:
    archive = class_archive(pyspark_home())
    assert archive is not None
    cache.mkdir(parents=True)
    archive.write_bytes(b"not a class-data archive" * 1000)
    state = tmp_path / "sc"
    try:
        info, started = ensure_local_connect_server(state, conf=CONF, idle_timeout_s=0)
        assert started and connect_server._answers(info.port)
        assert not archive.exists()  # not mapped by the JVM: deleted, so the next server writes one
    finally:
        stop_local_connect_server(state)


def test_a_server_that_fails_to_start_with_the_archive_is_started_without_it(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = class_archive(pyspark_home())
    assert archive is not None
    cache.mkdir(parents=True)
    archive.write_bytes(b"an archive this JVM crashes on")
    options: list[str] = []
    started = connect_server.ServerInfo(1, 2, "t", 0.0, "log")

    def launch(_state: Path, _conf: object, _timeout: float, _idle: float, option: str, dump: str
               ) -> connect_server.ServerInfo:
        options.append(option)
        if option:
            raise connect_server.ConnectServerError("exited with code 134 while starting")
        return started

    monkeypatch.setattr(connect_server, "_launch_with", launch)
    assert connect_server._launch(tmp_path, {}, 1.0, 0.0) is started
    assert options == [f"-XX:SharedArchiveFile={archive}", ""] and not archive.exists()
