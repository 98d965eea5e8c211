"""The laredo source's key, against this project's fan-out server (over Connect and gRPC).

The fan-out server reports its table's columns with their primary key in the handshake. Configured
`key_fields` must equal that key (the start fails naming both); unset, the reported key is used;
a server that reports no key (laredo-server sends no columns) gets the configured key, else
laredo's default `[id]`. A journal entry whose row lacks the key stops ingest naming the table,
the field and the position, and nothing of its transaction is buffered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from resources.buffer import BadChange, BufferReader, ChangeBuffer
from resources.ingest import run_ingest
from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.errors import KeyMismatch
from resources.subscribers.events import SchemaEvent
from resources.subscribers.fanout_server import FanoutServer
from resources.subscribers.laredo import LaredoSubscriber
from resources.subscribers.laredo_sequencer import Sequencer
from resources.subscribers.replication_wire import columns_to_proto
from snapshot_assets.archive.changes import Action
from tests.buffer.helpers import buffer_rows
from tests.fanout.support import COLUMNS, Collector, ScriptedSource, Sleeps

Servers = Callable[..., FanoutServer]
Clients = Callable[..., Collector]


def test_configured_key_fields_must_match_the_reported_primary_key(source: ScriptedSource, servers: Servers,
                                                                     clients: Clients) -> None:
    server = servers(source)
    sleeps = Sleeps()
    client = clients(server.url, key_fields=["tenant"], sleep=sleeps)
    error = client.wait_error()
    assert isinstance(error, KeyMismatch) and not error.transient
    assert str(error) == (f"public.items: key_fields [tenant] do not match the primary key [id] of public.items "
                          f"(as the laredo server {server.url} reports it)")
    assert sleeps.delays == []  # permanent: no reconnect loop
    assert client.snapshot() == []  # refused before a single event


@pytest.mark.parametrize("configured", [(), ("id",)])
def test_unset_or_matching_key_fields_take_the_reported_key(source: ScriptedSource, servers: Servers,
                                                            clients: Clients, configured: tuple[str, ...]) -> None:
    server = servers(source)
    client = clients(server.url, key_fields=configured)
    events = client.wait(lambda ev: any(isinstance(e, SchemaEvent) for e in ev))
    first = events[0]
    assert isinstance(first, SchemaEvent) and first.schema.key_fields == ("id",)


@pytest.mark.parametrize(("configured", "key"), [((), ("id",)), (("user_id",), ("user_id",))])
def test_a_server_reporting_no_key_gets_the_configured_or_default_key(configured: tuple[str, ...],
                                                                     key: tuple[str, ...]) -> None:
    subscriber = LaredoSubscriber("http://127.0.0.1:9", "public", "items", key_fields=configured)
    assert subscriber.schema_from_handshake(pb.SyncHandshake()).key_fields == key  # laredo-server: no columns
    keyless = columns_to_proto(COLUMNS)
    for c in keyless:
        c.is_primary_key, c.primary_key_ordinal = False, 0
    assert subscriber.schema_from_handshake(pb.SyncHandshake(columns=keyless)).key_fields == key


def _until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_change_without_its_key_stops_ingest_and_nothing_of_it_is_buffered(
        protocol: str, source: ScriptedSource, servers: Servers, tmp_path: Path) -> None:
    server = servers(source)
    subscriber = LaredoSubscriber(server.url, "public", "items", protocol=protocol, heartbeat_timeout=5.0)
    buffer = ChangeBuffer(tmp_path, "public.items", seal_interval=0.05)
    stop = threading.Event()
    outcome: list[BaseException | None] = []

    def ingest() -> None:
        try:
            run_ingest(subscriber, buffer, stop=stop)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=ingest, daemon=True)
    worker.start()
    try:
        _until(lambda: buffer.durable_position() is not None, "the initial load to be durable")
        good = source.insert(100)
        _until(lambda: buffer.durable_position() == good, "the good transaction to be durable")
        bad = source.commit((Action.INSERT, None, {"id": 101, "tenant": 1, "name": "fine"}),
                            (Action.INSERT, None, {"tenant": 1, "name": "no id"}))
        worker.join(20.0)
        assert not worker.is_alive() and outcome, "ingest should stop on the keyless change"
    finally:
        stop.set()
        subscriber.close()
        worker.join(5.0)
        buffer.close()
    error = outcome[0]
    assert isinstance(error, BadChange), repr(error)
    assert str(error) == (f"table public.items: INSERT at {bad}: the new row lacks key field 'id' "
                          "(key fields ['id'])")
    assert BufferReader(tmp_path, "public.items").durable_position() == good
    rows = buffer_rows(tmp_path, "public.items")
    assert [r["key"] for r in rows if r["action"] != "SNAPSHOT"] == ["[100]"]  # not even id 101 of the bad tx
    assert sum(r["action"] == "SNAPSHOT" for r in rows) == 8


def test_a_schema_change_is_keyed_and_checked_like_the_handshake() -> None:
    subscriber = LaredoSubscriber("http://127.0.0.1:9", "public", "items", key_fields=["id"])
    seq = Sequencer(subscriber.name, "0/50", fallback_after=100, schema_of=subscriber.schema_from_columns)
    seq.begin_stream(by_position=True, by_sequence=False)
    keyless = columns_to_proto(COLUMNS)
    for c in keyless:
        c.is_primary_key, c.primary_key_ordinal = False, 0
    seq.message(pb.SyncResponse(schema_change=pb.SchemaChangeNotification(sequence=1, new_columns=keyless)))
    (event,) = seq.take()
    assert isinstance(event, SchemaEvent) and event.schema.key_fields == ("id",)  # completed, not key-less
    rekeyed = columns_to_proto(COLUMNS)
    rekeyed[0].is_primary_key, rekeyed[1].is_primary_key, rekeyed[1].primary_key_ordinal = False, True, 1
    with pytest.raises(KeyMismatch, match=r"key_fields \[id\] do not match the primary key \[tenant\]"):
        seq.message(pb.SyncResponse(schema_change=pb.SchemaChangeNotification(sequence=2, new_columns=rekeyed)))
