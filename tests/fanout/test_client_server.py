"""The laredo client against the fan-out server, over Connect and gRPC (every test runs on both).

Each scenario checks the exact history (`check_history`): every boundary's changes equal the
source's, each once and in order, and every snapshot equals the source at its position.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from resources.subscribers.errors import SourceConfigError, UnknownTable
from resources.subscribers.events import ChangeEvent, Event, ResyncBegin, ResyncEnd, SnapshotRow
from resources.subscribers.fanout_server import FanoutServer
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.positions import format_lsn, parse_lsn
from tests.fanout.support import (
    Collector,
    ScriptedSource,
    Sleeps,
    TcpProxy,
    check_history,
    committed_to,
    tx_ends,
)

Servers = Callable[..., FanoutServer]
Clients = Callable[..., Collector]


def _has(kind: type, count: int = 1) -> Callable[[list[Event]], bool]:
    return lambda events: sum(isinstance(e, kind) for e in events) >= count


def _eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.02)


def _before(position: str) -> str:
    lsn = parse_lsn(position)
    assert lsn is not None
    return format_lsn(lsn - 1)


def test_full_snapshot_sits_just_before_the_next_change(source: ScriptedSource, servers: Servers,
                                                       clients: Clients) -> None:
    server = servers(source, heartbeat_interval=30)  # no heartbeat: the next change places the snapshot
    client = clients(server.url)
    client.wait(_has(SnapshotRow, 8))
    first = source.commit((Action.UPDATE, {"id": 1}, {"id": 1, "tenant": 1, "name": "renamed"}))
    second = source.commit((Action.DELETE, {"id": 2}, None))
    events = client.wait(lambda ev: any(isinstance(e, ChangeEvent) and e.position == second for e in ev))
    resync_end = next(e for e in events if isinstance(e, ResyncEnd))
    assert resync_end.position == _before(first)
    assert resync_end.row_count == 8
    assert [e.position for e in tx_ends(events)] == [first]
    history = check_history(events, source)
    assert history.resyncs == ["initial load"]


def test_quiet_snapshot_gets_a_sequence_derived_position(source: ScriptedSource, servers: Servers,
                                                        clients: Clients) -> None:
    server = servers(source)
    client = clients(server.url)
    events = client.wait(_has(ResyncEnd))
    resync_end = next(e for e in events if isinstance(e, ResyncEnd))
    assert resync_end.position == "0/00000001"  # format_lsn(max(1, snapshot sequence 0))
    position = source.insert(100)
    events = client.wait(committed_to(position))
    check_history(events, source)


def test_delta_resume_by_source_position(source: ScriptedSource, servers: Servers, clients: Clients) -> None:
    server = servers(source)
    first = clients(server.url)
    first.wait(_has(ResyncEnd))
    resume_at = [source.insert(100 + i) for i in range(3)][-1]
    first.wait(committed_to(resume_at))
    first.stop()
    later = [source.insert(200 + i) for i in range(3)]
    later.append(source.commit((Action.DELETE, {"id": 100}, None)))
    second = clients(server.url, start_at=resume_at)
    events = second.wait(committed_to(later[-1]))
    assert not any(isinstance(e, (ResyncBegin, SnapshotRow)) for e in events)
    check_history(events, source, start=resume_at)
    assert [e.position for e in tx_ends(events)] == later


def test_goaway_handoff_loses_and_repeats_nothing(protocol: str, source: ScriptedSource, servers: Servers,
                                                 clients: Clients) -> None:
    old, new = servers(source), servers(source)
    proxy = TcpProxy(old.port)
    try:
        scheme = "http" if protocol == "connect" else "grpc"
        client = clients(f"{scheme}://127.0.0.1:{proxy.port}")
        client.wait(_has(ResyncEnd))
        stop = threading.Event()

        def write() -> None:
            ident = 1000
            while not stop.is_set():
                source.commit((Action.INSERT, None, {"id": ident, "tenant": 1, "name": "x"}),
                              (Action.UPDATE, {"id": ident}, {"id": ident, "tenant": 2, "name": "y"}))
                ident += 1
                time.sleep(0.005)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        client.wait(lambda ev: len(tx_ends(ev)) >= 5)
        proxy.target_port = new.port  # the balancer now routes new connections to the new instance
        old.go_away("admin", deadline_s=1.0)
        _eventually(lambda: client.subscriber.stats.handoffs == 1)
        time.sleep(0.3)
        stop.set()
        writer.join()
        events = client.wait(committed_to(source.head))
        history = check_history(events, source)
        assert len(history.resyncs) == 1
        assert len(history.boundaries) > 10
        _eventually(lambda: old.core.client_count() == 0)
        assert new.core.client_count() == 1
        assert client.subscriber.stats.reconnects == 0
    finally:
        proxy.close()


def test_goaway_to_a_server_that_cannot_resume_falls_back_to_a_snapshot(
        protocol: str, source: ScriptedSource, servers: Servers, clients: Clients) -> None:
    old = servers(source)
    proxy = TcpProxy(old.port)
    try:
        scheme = "http" if protocol == "connect" else "grpc"
        client = clients(f"{scheme}://127.0.0.1:{proxy.port}", sleep=Sleeps())
        client.wait(_has(ResyncEnd))
        position = source.insert(100)
        client.wait(committed_to(position))
        # An instance whose journal starts after the client's position (it was restored later).
        later = ScriptedSource(list(source.state_at(position).values()), start_lsn=0x9_0000)
        new = servers(later)
        proxy.target_port = new.port
        old.go_away("draining", deadline_s=0.3)
        events = client.wait(_has(ResyncEnd, 2))
        assert [e.reason for e in events if isinstance(e, ResyncBegin)][1] == \
            f"server sent a full snapshot (resume from {position})"
        assert client.subscriber.stats.handoffs == 0 and client.subscriber.stats.reconnects == 1
        assert new.core.sessions_started >= 2  # the abandoned hand-off stream, then the reconnect
        following = later.insert(200)
        events = client.wait(committed_to(following))
        assert isinstance(events[-2], ChangeEvent) and events[-2].new == {"id": 200, "tenant": 1, "name": "n200"}
    finally:
        proxy.close()


def test_heartbeat_silence_reconnects_without_duplicates(source: ScriptedSource, servers: Servers,
                                                        clients: Clients) -> None:
    server = servers(source, heartbeat_interval=30)  # a server that goes silent
    sleeps = Sleeps()
    client = clients(server.url, heartbeat_timeout=0.5, sleep=sleeps)
    client.wait(_has(SnapshotRow, 8))
    first = source.insert(100)
    client.wait(lambda ev: any(isinstance(e, ChangeEvent) for e in ev))
    _eventually(lambda: client.subscriber.stats.heartbeat_timeouts >= 1
                and server.core.sessions_started >= 2)
    second = source.insert(101)
    events = client.wait(lambda ev: any(isinstance(e, ChangeEvent) and e.position == second for e in ev))
    assert [e.position for e in events if isinstance(e, ChangeEvent)] == [first, second]
    assert [e.position for e in tx_ends(events)] == [first]
    check_history(events, source)
    assert sleeps.delays[0] == 1.0
    assert "no heartbeat" in (client.subscriber.stats.last_error or "")


def test_server_errors_invalid_argument_is_permanent(source: ScriptedSource, servers: Servers,
                                                    clients: Clients) -> None:
    server = servers(source)
    sleeps = Sleeps()
    client = clients(server.url, filters=[{"field": "no_such_column", "equals": 1}], sleep=sleeps)
    error = client.wait_error()
    assert isinstance(error, SourceConfigError) and not error.transient
    assert "public.items" in str(error) and "INVALID_ARGUMENT" in str(error)
    assert "no_such_column" in str(error)
    assert sleeps.delays == []


def test_server_errors_not_found_is_permanent(source: ScriptedSource, servers: Servers, clients: Clients) -> None:
    server = servers(source)
    sleeps = Sleeps()
    client = clients(server.url, table="missing", sleep=sleeps)
    error = client.wait_error()
    assert isinstance(error, UnknownTable) and not error.transient
    assert "public.missing" in str(error)
    assert "NOT_FOUND: no fan-out target for public.missing" in str(error)
    assert sleeps.delays == []


def test_server_errors_resource_exhausted_is_retried(source: ScriptedSource, servers: Servers,
                                                    clients: Clients) -> None:
    server = servers(source, max_clients=1)
    first = clients(server.url)
    first.wait(_has(ResyncEnd))
    sleeps = Sleeps({1: first.stop}, real=0.05)
    second = clients(server.url, sleep=sleeps)
    second.wait(_has(ResyncEnd))
    assert sleeps.delays[0] == 1.0
    assert "RESOURCE_EXHAUSTED" in (second.subscriber.stats.last_error or "")


def test_resume_outside_the_journal_resyncs(source: ScriptedSource, servers: Servers, clients: Clients) -> None:
    server = servers(source, journal_size=3, heartbeat_interval=30)
    resume_at = source.insert(100)  # a position the client committed earlier
    for i in range(6):
        source.insert(200 + i)  # ... that the 3-entry journal no longer covers
    second = clients(server.url, start_at=resume_at)
    second.wait(_has(SnapshotRow, 1))
    position = source.insert(300)
    source.insert(301)
    # The client reconnects after the server refuses the resume, and again when the resynced stream
    # is quiet past its no-message watchdog (5 s, heartbeats here come every 30): under a loaded
    # machine that takes more than the default 10 s.
    events = second.wait(committed_to(position), timeout=30.0)
    history = check_history(events, source, start=resume_at)
    assert history.resyncs == [f"server sent a full snapshot (resume from {resume_at})"]
    assert history.boundaries[0] == _before(position)


def test_filters_are_applied_by_the_server(source: ScriptedSource, servers: Servers, clients: Clients) -> None:
    def wanted(action: Action, old: Row | None, new: Row | None) -> bool:
        if action is Action.TRUNCATE:
            return True
        row = old if action is Action.DELETE else new
        assert row is not None
        name = row.get("name")
        return row.get("tenant") == 1 and isinstance(name, str) and name.startswith("row")

    server = servers(source, heartbeat_interval=30)
    client = clients(server.url, filters=[{"field": "tenant", "equals": 1.0}, {"field": "name", "prefix": "row"}])
    client.wait(_has(SnapshotRow, 4))
    source.commit(
        (Action.INSERT, None, {"id": 50, "tenant": 1, "name": "row-50"}),
        (Action.INSERT, None, {"id": 51, "tenant": 2, "name": "row-51"}),
        (Action.INSERT, None, {"id": 52, "tenant": 1, "name": "other"}),
        (Action.INSERT, None, {"id": 53, "tenant": None, "name": "row-53"}),
    )
    source.commit((Action.UPDATE, {"id": 2}, {"id": 2, "tenant": 1, "name": "row-2b"}),
                  (Action.DELETE, {"id": 4, "tenant": 1, "name": "row-4"}, None),
                  (Action.DELETE, {"id": 3, "tenant": 2, "name": "row-3"}, None))
    source.commit((Action.TRUNCATE, None, None))
    last = source.commit((Action.INSERT, None, {"id": 60, "tenant": 1, "name": "row-60"}))
    source.insert(61, tenant=1, name="row-61")
    events = client.wait(committed_to(last))
    check_history(events, source, row_filter=wanted)
    snapshot = [e.row["id"] for e in events if isinstance(e, SnapshotRow)]
    assert sorted(snapshot) == [2, 4, 6, 8]  # tenant 1
    changed = [(e.action, (e.new or e.old or {}).get("id")) for e in events if isinstance(e, ChangeEvent)]
    assert (Action.INSERT, 51) not in changed and (Action.INSERT, 52) not in changed
    assert (Action.INSERT, 53) not in changed and (Action.DELETE, 3) not in changed
    assert (Action.TRUNCATE, None) in changed


def test_truncate_reaches_the_client(source: ScriptedSource, servers: Servers, clients: Clients) -> None:
    server = servers(source, heartbeat_interval=30)
    client = clients(server.url)
    client.wait(_has(SnapshotRow, 8))
    position = source.commit((Action.TRUNCATE, None, None), (Action.INSERT, None, {"id": 9, "tenant": 1, "name": "a"}))
    source.insert(10)
    events = client.wait(committed_to(position))
    changes = [e for e in events if isinstance(e, ChangeEvent)]
    assert changes[0].action is Action.TRUNCATE and changes[0].old is None and changes[0].new is None
    assert changes[0].position == position
    check_history(events, source)


def test_source_resync_makes_clients_start_over(source: ScriptedSource, servers: Servers, clients: Clients) -> None:
    """A re-sync of the server's own source ends live streams; clients come back to a snapshot."""
    server = servers(source, journal_size=1000)
    client = clients(server.url, sleep=Sleeps())
    client.wait(_has(ResyncEnd))
    position = source.insert(100)
    client.wait(committed_to(position))
    source.resync()
    events = client.wait(_has(ResyncEnd, 2))
    history = check_history(events, source)
    assert history.resyncs == ["initial load", f"server sent a full snapshot (resume from {position})"]
    assert "re-synced" in (client.subscriber.stats.last_error or "")
    later = source.insert(101)
    check_history(client.wait(committed_to(later)), source)
