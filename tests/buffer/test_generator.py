"""The generator source: deterministic, resumable, PostgreSQL-shaped, and its reference model is right."""

from __future__ import annotations

import itertools
import time

import pytest

from resources.subscribers.events import (
    ChangeEvent,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TxEnd,
)
from resources.subscribers.generator import KEY_FIELDS, GeneratorSubscriber
from snapshot_assets.archive.algebra import TableState, apply
from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.keys import typed_key
from snapshot_assets.archive.positions import compare_lsn, parse_lsn

MIX = {"insert": 0.3, "update": 0.5, "delete": 0.17, "truncate": 0.03}


def gen(**kw: object) -> GeneratorSubscriber:
    options: dict[str, object] = {"seed": 5, "rows": 60, "changes": 1500, "mix": MIX, "pk_change": 0.1}
    options.update(kw)
    return GeneratorSubscriber(**options)  # type: ignore[arg-type]


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    assert list(gen().events(None)) == list(gen().events(None))
    assert list(gen().events(None)) != list(gen(seed=6).events(None))


def test_stream_shape() -> None:
    events = list(gen().events(None))
    assert isinstance(events[0], SchemaEvent) and events[0].schema.key_fields == ("id",)
    assert isinstance(events[1], ResyncBegin)
    end = next(e for e in events if isinstance(e, ResyncEnd))
    assert end.position == "1/6B374D48" and end.row_count == 60
    stream = events[events.index(end) + 1:]
    positions = [e.position for e in stream if isinstance(e, TxEnd)]
    assert all(parse_lsn(p) is not None for p in positions)
    assert all(compare_lsn(a, b) < 0 for a, b in itertools.pairwise([end.position, *positions]))
    tx: list[ChangeEvent] = []
    for event in stream:  # every change belongs to a transaction sharing its commit position
        if isinstance(event, ChangeEvent):
            tx.append(event)
        else:
            assert isinstance(event, TxEnd) and tx and {c.position for c in tx} == {event.position}
            tx = []
    changes = [e for e in stream if isinstance(e, ChangeEvent)]
    # the limit ends the stream after the transaction that reaches it (never mid-transaction)
    assert 1500 <= len(changes) < 1500 + 5 and [c.sequence for c in changes] == list(range(1, len(changes) + 1))
    actions = {c.action for c in changes}
    assert actions == set(Action)
    moves = [c for c in changes if c.action is Action.UPDATE and c.old and c.new and c.old["id"] != c.new["id"]]
    assert moves, "primary-key-changing updates occur"
    rows = [e.row for e in events if isinstance(e, SnapshotRow)] + [c.new for c in changes if c.new]
    assert any(r["id"] > 2**53 for r in rows) and any(abs(r["balance"]) > 2**53 for r in rows)


def test_truncate_is_off_by_default() -> None:
    stream = GeneratorSubscriber(seed=1, rows=10, changes=2000).events(None)
    assert not any(isinstance(e, ChangeEvent) and e.action is Action.TRUNCATE for e in stream)


def test_resume_after_any_position_is_the_suffix() -> None:
    g = gen(resync_every=40)
    full = list(g.events(None))
    boundaries = [e.position for e in full if isinstance(e, TxEnd | ResyncEnd)]
    for position in [*boundaries[::37], boundaries[-1]]:
        cut = max(i for i, e in enumerate(full) if isinstance(e, TxEnd | ResyncEnd) and e.position == position)
        assert list(g.events(position))[1:] == full[cut + 1:], position
    with pytest.raises(ValueError, match="before its initial load"):
        next(iter(g.events("0/1")))


def test_reference_model_matches_the_replayed_stream_at_every_transaction() -> None:
    g = gen(resync_every=50)
    state: TableState = {}
    pending: TableState = {}
    checked = 0
    for event in g.events(None):
        if isinstance(event, ResyncBegin):
            pending = {}
        elif isinstance(event, SnapshotRow):
            pending[typed_key(event.row, KEY_FIELDS)] = event.row
        elif isinstance(event, ResyncEnd):
            state = pending
            assert state == g.table_at(event.position)
        elif isinstance(event, ChangeEvent):
            apply(state, [Change(event.action, "", old=event.old, new=event.new)], KEY_FIELDS)
        elif isinstance(event, TxEnd):
            if checked % 7 == 0 or checked < 30:
                assert state == g.table_at(event.position), event.position
            checked += 1
    assert checked > 300
    assert state == g.table_at(g.end_position() or "")


def test_rate_paces_the_stream_and_close_interrupts_it() -> None:
    g = GeneratorSubscriber(seed=2, rows=5, changes=None, rate=400.0)
    started = time.monotonic()
    events = g.events(None)
    changes = sum(1 for e in itertools.islice(events, 400) if isinstance(e, ChangeEvent))
    elapsed = time.monotonic() - started
    assert elapsed >= 0.8 * (changes - 5) / 400
    g.close()
    rest = list(events)  # finishes the current transaction at most, without waiting
    assert len(rest) <= 6 and time.monotonic() - started < elapsed + 0.5


@pytest.mark.parametrize("bad", [{"mix": {"upsert": 1.0}}, {"mix": {"insert": 0.0}}, {"tx_size": (0, 2)},
                                 {"rate": 0.0}, {"rows": -1}])
def test_bad_configuration_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        GeneratorSubscriber(**bad)  # type: ignore[arg-type]


def test_acknowledge_records_the_highest_position() -> None:
    g = gen()
    g.acknowledge("1/00000010")
    g.acknowledge("0/00000020")
    assert g.acknowledged == "1/00000010"


def test_a_larger_limit_extends_the_stream_exactly() -> None:
    """A stream bounded at N changes is a prefix of the same seed's longer stream, to the transaction."""
    short = [e for e in gen(changes=700).events(None)]
    long = [e for e in gen(changes=1400).events(None)]
    assert long[: len(short)] == short
    assert isinstance(short[-1], TxEnd)
