"""The laredo client against scripted servers (both transports): behaviours a well-behaved fan-out
server never shows, but laredo-server may (empty positions, no positions at all, streams that end).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.events import ChangeEvent, Event, ResyncEnd, TxEnd
from resources.subscribers.fanout_core import Alive
from resources.subscribers.fanout_server import Listener, SyncHandler, listener_url
from resources.subscribers.laredo_sequencer import SEQUENCE_SOURCE
from tests.fanout.support import (
    Collector,
    Sleeps,
    hold_open,
    msg_entry,
    msg_handshake,
    msg_heartbeat,
    msg_snapshot,
)

Listeners = Callable[[SyncHandler], Listener]
Clients = Callable[..., Collector]

ROWS = [{"id": 1, "tenant": 1, "name": "a"}, {"id": 2, "tenant": 1, "name": "b"}]


def _summary(events: list[Event]) -> list[tuple[str, str, int | str]]:
    out: list[tuple[str, str, int | str]] = []
    for event in events:
        if isinstance(event, ChangeEvent):
            out.append(("change", event.position, event.sequence))
        elif isinstance(event, TxEnd):
            out.append(("txend", event.position, "sequence" if event.extra == SEQUENCE_SOURCE else ""))
        elif isinstance(event, ResyncEnd):
            out.append(("resyncend", event.position, event.row_count))
    return out


def _ending_server(healthy_calls: set[int]) -> SyncHandler:
    """Each call: a handshake, a heartbeat if the call is 'healthy', then a clean end."""
    calls = itertools.count(1)

    def handler(request: pb.SyncRequest, alive: Alive) -> Iterator[pb.SyncResponse]:
        call = next(calls)
        yield msg_handshake(pb.SYNC_MODE_DELTA)
        if call in healthy_calls:
            yield msg_heartbeat()

    return handler


def test_clean_end_reconnects_with_doubling_backoff(listeners: Listeners, clients: Clients) -> None:
    listener = listeners(_ending_server(set()))
    holder: list[Collector] = []
    sleeps = Sleeps({7: lambda: holder[0].subscriber.close()})
    holder.append(clients(listener_url(listener), start_at="0/100", sleep=sleeps))
    assert holder[0].done.wait(10)
    assert holder[0].error is None
    assert sleeps.delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert holder[0].subscriber.stats.connects == 7


def test_backoff_resets_after_a_healthy_stream(listeners: Listeners, clients: Clients) -> None:
    listener = listeners(_ending_server({4}))
    holder: list[Collector] = []
    sleeps = Sleeps({6: lambda: holder[0].subscriber.close()})
    holder.append(clients(listener_url(listener), start_at="0/100", sleep=sleeps, backoff_initial=0.5,
                          backoff_max=1.5))
    assert holder[0].done.wait(10)
    assert sleeps.delays == [0.5, 1.0, 1.5, 0.5, 1.0, 1.5]


def test_entries_without_positions_never_make_empty_or_repeated_boundaries(listeners: Listeners,
                                                                            clients: Clients) -> None:
    def handler(request: pb.SyncRequest, alive: Alive) -> Iterator[pb.SyncResponse]:
        yield msg_handshake(pb.SYNC_MODE_FULL_SNAPSHOT)
        yield from msg_snapshot(5, ROWS)
        yield msg_entry(6, "", 6)
        yield msg_entry(7, "0/100", 7)
        yield msg_entry(8, "0/100", 8)
        yield msg_entry(9, "", 9)
        yield msg_entry(10, "0/200", 10)
        yield msg_heartbeat()
        yield msg_entry(11, "", 11)
        yield msg_entry(12, "0/0", 12)  # PostgreSQL's invalid LSN: no position either
        yield msg_entry(13, "", 13)
        yield msg_entry(14, "0/202", 14)  # real, but below the sequence-derived 0/203 already committed
        yield msg_entry(15, "0/300", 15)
        yield msg_heartbeat()
        hold_open(alive)

    listener = listeners(handler)
    client = clients(listener_url(listener), sequence_fallback_after=3)
    events = client.wait(lambda ev: any(isinstance(e, TxEnd) and e.position == "0/300" for e in ev))
    assert _summary(events) == [
        ("resyncend", "0/000000FF", 2),  # just before the first real position
        ("change", "0/100", 6), ("change", "0/100", 7), ("change", "0/100", 8),
        ("txend", "0/100", ""),
        ("change", "0/200", 9), ("change", "0/200", 10),
        ("txend", "0/200", ""),  # on the heartbeat
        ("change", "0/00000203", 11), ("change", "0/00000203", 12), ("change", "0/00000203", 13),
        ("txend", "0/00000203", "sequence"),  # three entries without a position: the fallback
        ("change", "0/300", 14), ("change", "0/300", 15),
        ("txend", "0/300", ""),
    ]


def test_server_without_positions_resumes_by_sequence(listeners: Listeners, clients: Clients) -> None:
    requests: list[pb.SyncRequest] = []

    def handler(request: pb.SyncRequest, alive: Alive) -> Iterator[pb.SyncResponse]:
        requests.append(request)
        if len(requests) == 1:
            yield msg_handshake(pb.SYNC_MODE_FULL_SNAPSHOT)
            yield from msg_snapshot(10, ROWS)
            for sequence in range(11, 18):
                yield msg_entry(sequence, "", sequence)
            yield msg_heartbeat()
            return  # a clean end: the client comes back with its sequence
        yield msg_handshake(pb.SYNC_MODE_DELTA)
        yield msg_entry(17, "", 17)  # already delivered: dropped by sequence
        yield msg_entry(18, "", 18)
        yield msg_heartbeat()
        hold_open(alive)

    listener = listeners(handler)
    client = clients(listener_url(listener), sequence_fallback_after=3, sequence_resume=True, sleep=Sleeps())
    events = client.wait(lambda ev: any(isinstance(e, TxEnd) and e.position == "0/00000012" for e in ev))
    assert _summary(events) == [
        ("resyncend", "0/0000000A", 2),  # format_lsn(snapshot sequence 10)
        *[("change", "0/0000000D", s) for s in (11, 12, 13)], ("txend", "0/0000000D", "sequence"),
        *[("change", "0/00000010", s) for s in (14, 15, 16)], ("txend", "0/00000010", "sequence"),
        ("change", "0/00000011", 17), ("txend", "0/00000011", "sequence"),  # on the heartbeat
        ("change", "0/00000012", 18), ("txend", "0/00000012", "sequence"),
    ]
    assert requests[1].last_known_sequence == 17 and not requests[1].last_known_source_position


def test_reconnect_repeats_no_change_of_an_open_transaction(listeners: Listeners, clients: Clients) -> None:
    """A stream dies mid-transaction: the resumed stream re-sends it and the repeats are skipped."""
    requests: list[pb.SyncRequest] = []

    def handler(request: pb.SyncRequest, alive: Alive) -> Iterator[pb.SyncResponse]:
        requests.append(request)
        if len(requests) == 1:
            yield msg_handshake(pb.SYNC_MODE_DELTA)
            yield msg_entry(1, "0/100", 1)
            yield msg_entry(2, "0/200", 2)
            yield msg_entry(3, "0/200", 3)  # ... and the connection drops inside 0/200
            raise ConnectionAbortedError("simulated crash")
        yield msg_handshake(pb.SYNC_MODE_DELTA)
        for sequence, position in ((2, "0/200"), (3, "0/200"), (4, "0/200"), (5, "0/300")):
            yield msg_entry(sequence, position, sequence)
        yield msg_heartbeat()
        hold_open(alive)

    listener = listeners(handler)
    client = clients(listener_url(listener), start_at="0/80", sleep=Sleeps())
    events = client.wait(lambda ev: any(isinstance(e, TxEnd) and e.position == "0/300" for e in ev))
    assert _summary(events) == [
        ("change", "0/100", 1), ("txend", "0/100", ""),
        ("change", "0/200", 2), ("change", "0/200", 3),
        ("change", "0/200", 4), ("txend", "0/200", ""),
        ("change", "0/300", 5), ("txend", "0/300", ""),
    ]
    assert requests[1].last_known_source_position == "0/100"
