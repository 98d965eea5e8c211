"""Spark test fixtures: ONE classic local[2] session for the whole run, and generated change buffers.

Buffers are written by the real `ChangeBuffer`, fed by the `GeneratorSubscriber` (initial load,
transactions with PK-changing updates and optional TRUNCATEs / re-syncs), so the Spark jobs read
exactly the files production writes. Oracles are the single-process archive code on the same data.
"""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from resources.buffer import BufferReader, ChangeBuffer
from resources.subscribers.events import ResyncEnd, TxEnd
from resources.subscribers.generator import KEY_FIELDS, GeneratorSubscriber
from snapshot_assets.archive.changes import Change, Row
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.keys import TypedKey, typed_key
from snapshot_assets.spark.effects import WINDOW_CHANGES_CONF, buffer_change
from snapshot_assets.spark.parts import StagedFormat
from snapshot_assets.spark.session import CONNECT_MODE, LOCAL_DEFAULTS, SESSION_DEFAULTS, classic_session
from tests.buffer.helpers import read_refs
from tests.spark.cluster import cluster_spark, report_cluster_logs, spark_cluster  # noqa: F401 - fixtures

TABLE = "public.users"
#: The tests' windows are small: a partition per 100 changes keeps their shuffles several partitions
#: wide, as a production-sized window's are (the product's default would give them one).
SMALL_WINDOWS_SPLIT = {WINDOW_CHANGES_CONF: "100"}
ALL_FORMATS = ("jsonl", "protobuf", "parquet")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                               call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    report_cluster_logs(item, report)
    return report


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The suite's one Spark session (classic local[2]: no server to manage for most tests)."""
    conf = {**SESSION_DEFAULTS, **LOCAL_DEFAULTS, "spark.sql.shuffle.partitions": "3", "spark.driver.memory": "2g",
            "spark.ui.showConsoleProgress": "false", **SMALL_WINDOWS_SPLIT}
    session = classic_session("local[2]", conf, "snapshotter-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@dataclass
class Generated:
    """A sealed buffer of a generated stream, and what the oracles need to know about it."""

    root: Path
    reader: BufferReader
    gen: GeneratorSubscriber
    boundaries: list[str]  # every transaction end, in order
    resyncs: list[str]  # every re-sync end (the initial load first)


def generate(root: Path, seed: int, *, rows: int = 150, changes: int = 1500, truncate: float = 0.0,
             pk_change: float = 0.08, resync_every: int = 0, seal_changes: int = 200,
             tx_size: tuple[int, int] = (1, 8), identity: str = "full",
             mix: dict[str, float] | None = None) -> Generated:
    """A generated stream sealed into a buffer at `root`; `mix` (the generator's action weights)
    defaults to mostly updates, some inserts and deletes, and TRUNCATEs at the `truncate` weight."""
    mix = mix or {"insert": 0.3, "update": 0.5, "delete": 0.15, "truncate": truncate}
    gen = GeneratorSubscriber(TABLE, seed=seed, rows=rows, changes=changes, mix=mix, pk_change=pk_change,
                              resync_every=resync_every, tx_size=tx_size, hot_keys=0.2, hot_share=0.6,
                              identity=identity)
    boundaries: list[str] = []
    resyncs: list[str] = []
    with ChangeBuffer(root, TABLE, seal_interval=3600.0, seal_changes=seal_changes) as buffer:
        for event in gen.events(None):
            buffer.append(event)
            if isinstance(event, TxEnd):
                boundaries.append(event.position)
            elif isinstance(event, ResyncEnd):
                resyncs.append(event.position)
        buffer.seal()
    return Generated(root, BufferReader(root, TABLE), gen, boundaries, resyncs)


def window_changes(reader: BufferReader, from_position: str, to_position: str) -> list[Change]:
    """The buffer's changes in (from, to], read in seq order without Spark (the oracle's input)."""
    refs = reader.segments(from_position, to_position)
    return [buffer_change(r["action"], r["key"], r["old"], r["new"], KEY_FIELDS) for r in read_refs(refs)]


def by_key(rows: Sequence[Row], key_fields: Sequence[str] = KEY_FIELDS) -> dict[TypedKey, Row]:
    out = {typed_key(r, key_fields): r for r in rows}
    assert len(out) == len(rows), "duplicate keys"
    return out


def read_parts(staged: StagedFormat, kind: str) -> list[Any]:
    """Decode a staged artifact with the format's reader (snapshot rows or diff changes)."""
    fmt = FORMATS[staged.format_id]
    source = io.BytesIO(staged_bytes(staged))
    return list(fmt.read_snapshot(source) if kind == "snapshot" else fmt.read_diff(source))


def python_bytes(format_id: str, kind: str, items: Sequence[Any]) -> bytes:
    """What the single-process writer produces for `items`."""
    fmt = FORMATS[format_id]
    out = io.BytesIO()
    writer = fmt.snapshot_writer(out, KEY_FIELDS) if kind == "snapshot" else fmt.diff_writer(out, KEY_FIELDS)
    for item in items:
        writer.write(item)
    writer.close()
    return out.getvalue()


def frames(data: bytes, format_id: str) -> list[bytes]:
    """The records of a jsonl (lines) or length-delimited protobuf artifact, each as its bytes."""
    if format_id == "jsonl":
        return data.splitlines(keepends=True)
    records, pos = [], 0
    while pos < len(data):
        length = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        records.append(data[pos:pos + length])
        pos += length
    return records


def staged_bytes(staged: StagedFormat) -> bytes:
    """The object a local build's staged pieces make: their bytes in order (the byte formats'
    buckets; parquet's magic, bucket bodies and footer)."""
    return b"".join(p.read_bytes() for p in staged.parts)


def change_multiset(changes: Sequence[Change]) -> list[tuple[str, str, Any, Any]]:
    """Changes as sortable tuples (order-free comparison of the per-key changes)."""
    from snapshot_assets.archive import gojson

    def text(row: Mapping[str, Any] | None) -> str:
        return "" if row is None else gojson.encode_row(dict(row), lambda: "")

    return sorted((c.action.value, c.key, text(c.old), text(c.new)) for c in changes)


def closed_endpoint() -> str:
    """A Spark Connect URL where nothing listens (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"sc://127.0.0.1:{s.getsockname()[1]}"


def connect_sessions() -> tuple[Any, Any]:
    """The process's active and default Spark Connect sessions (None for none): what a builder's
    `getOrCreate` hands out, whatever URL it asks for."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return ConnectSession.getActiveSession(), ConnectSession._get_default_session()


def assert_no_connect_session_left(before: tuple[Any, Any]) -> None:
    """The process is not in connect mode and its active and default Connect sessions are still the
    ones it had `before` (`connect_sessions()`): a failed or abandoned session did not become what
    the next builder hands out. (A session another test keeps open may be there all along.)"""
    assert CONNECT_MODE not in os.environ
    now = connect_sessions()
    assert now[0] is before[0] and now[1] is before[1], f"{now} left, {before} before"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pyspark warns about pandas 3 on every import path it checks; nothing here uses pandas."""
    quiet = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
    for item in items:
        if "tests/spark/" in item.nodeid:
            item.add_marker(quiet)
