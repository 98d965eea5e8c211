"""The change algebra as Spark SQL equals `algebra.collapse`, over random change sequences.

Each hypothesis example is a batch of generated windows (inserts, updates, deletes, primary-key
changes, TRUNCATEs; single, string and composite keys, integers beyond 2^53; full, partial and
absent before-images; rows from segments older than the derived key columns), encoded by ingest's
own `encode_change` and tagged with a window id: the production functions fold every window of a
batch in one Spark job (`scope`), so an example of 15 to 60 windows costs a few Spark calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resources.buffer.segments import encode_change
from resources.subscribers.events import ChangeEvent
from snapshot_assets.archive import gojson
from snapshot_assets.archive.algebra import collapse, identity
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.spark.effects import (
    BUFFER_DDL,
    after_cut,
    buffer_change,
    explode,
    fold,
    key_json,
    net_rows,
    upgrade_legacy,
    window_facts,
)

SCOPE = ("window",)
BIG = 2**53
KEYSPACES: list[tuple[tuple[str, ...], list[tuple[Any, ...]]]] = [
    (("id",), [(1,), (2,), (1_000_000,), (BIG,), (BIG + 1,), (-(BIG + 3),), (2**63 - 1,)]),
    (("id",), [("k",), ("9007199254740993",), ("<a&b>",), ("Zoë",), ("",)]),
    (("tenant", "id"), [(t, i) for t in ("acme", "b\"q") for i in (1, 1_000_000, BIG + 1)]),
]
VALUES = st.one_of(st.integers(-(2**64), 2**64), st.sampled_from([1.5, 1e21, -0.0, 1e-7, 123456.0]),
                   st.text(max_size=4), st.none(), st.booleans(),
                   st.just({"b": [1, "x"], "a": None}), st.just([BIG + 1, "<"]))
OPS = ["insert"] * 3 + ["update"] * 4 + ["delete"] * 2 + ["move"] * 2 + ["truncate"]
OLD_SHAPES = ["full"] * 3 + ["none", "key", "other"]


def row(fields: Sequence[str], key: tuple[Any, ...], value: Any, extra: Any) -> Row:
    return {**dict(zip(fields, key, strict=True)), "v": value, "w": extra}


Window = tuple[list[ChangeEvent], bool]


@st.composite
def windows(draw: st.DrawFn, fields: tuple[str, ...], keys: list[tuple[Any, ...]]) -> Window:
    """One window a primary-keyed source could send (the start state is implicit: the keys the
    window first updates or deletes existed), and whether it is read from a legacy segment."""
    present = {k: row(fields, k, draw(VALUES), 0) for k in keys if draw(st.booleans())}
    events: list[ChangeEvent] = []
    for _ in range(draw(st.integers(0, 14))):
        absent = [k for k in keys if k not in present]
        allowed = {"insert": bool(absent), "update": bool(present), "delete": bool(present),
                   "move": bool(present and absent), "truncate": True}
        op = draw(st.sampled_from([op for op in OPS if allowed[op]]))
        if op == "truncate":
            present.clear()
            events.append(ChangeEvent("0/1", Action.TRUNCATE))
            continue
        source = draw(st.sampled_from(absent if op == "insert" else sorted(present, key=repr)))
        target = draw(st.sampled_from(absent)) if op == "move" else source
        new = row(fields, target, draw(VALUES), draw(VALUES))
        old = present.pop(source, None)
        if op == "insert":
            events.append(ChangeEvent("0/1", Action.INSERT, new=new))
        elif op == "delete":
            assert old is not None
            shape = draw(st.sampled_from(["full", "key"]))
            events.append(ChangeEvent("0/1", Action.DELETE, old=old_image(old, fields, shape, moved=True)))
            continue
        else:
            assert old is not None
            shape = draw(st.sampled_from(OLD_SHAPES))
            events.append(ChangeEvent("0/1", Action.UPDATE, old=old_image(old, fields, shape, op == "move"), new=new))
        present[target] = new
    return events, draw(st.booleans())


def batches() -> st.SearchStrategy[tuple[tuple[str, ...], list[Window]]]:
    """A key layout and 15 to 60 windows over it (one Spark job folds them all)."""
    return st.sampled_from(KEYSPACES).flatmap(
        lambda space: st.tuples(st.just(space[0]), st.lists(windows(*space), min_size=15, max_size=60)))


def old_image(old: Row, fields: Sequence[str], shape: str, moved: bool) -> Row | None:
    """What the source sends as `old`: the whole row, nothing, the key columns, or (REPLICA IDENTITY
    USING INDEX) other columns; a primary-key change always names its old key."""
    if shape == "full":
        return old
    if shape == "key" or (moved and shape != "full"):
        return {f: old[f] for f in fields}
    return None if shape == "none" else {"w": old["w"]}


def text(image: Row | None) -> str | None:
    return None if image is None else gojson.encode_row(dict(image), lambda: "")


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches())
def test_sql_net_changes_equal_collapse(spark: Any, batch: tuple[tuple[str, ...], list[Window]]) -> None:
    fields, generated = batch
    rows: list[tuple[Any, ...]] = []
    expected: dict[int, tuple[bool, dict[str, Net]]] = {}
    for window_id, (events, legacy) in enumerate(generated):
        for seq, event in enumerate(events, start=1):
            encoded, _ = encode_change(event, seq, fields)
            if legacy:  # a segment written before the derived key columns existed
                encoded = (*encoded[:8], None, None, None, None, None, *encoded[13:])
            rows.append((window_id, *encoded))
        expected[window_id] = collapsed(events, fields)
    frame = spark.createDataFrame(rows, f"window BIGINT, {BUFFER_DDL}")
    facts = window_facts(frame, SCOPE)
    changes = after_cut(frame, facts, SCOPE)
    if facts.legacy:
        changes = upgrade_legacy(changes, fields)
    got: dict[int, tuple[bool, dict[str, Net]]] = {i: (False, {}) for i in expected}
    for cut in facts.cuts.collect():
        got[cut["window"]] = (cut["cut"] is not None, {})
    folded = fold(explode(changes, SCOPE), partitions=3, scope=SCOPE)
    for r in net_rows(folded, fields, SCOPE, unnamed=facts.unnamed).collect():
        assert r["key"] not in got[r["window"]][1], "one net change per key"
        got[r["window"]][1][r["key"]] = (r["action"], r["change_key"], r["old"], r["new"])
    assert got == expected


Net = tuple[str, str, str | None, str | None]


def collapsed(events: list[ChangeEvent], fields: tuple[str, ...]) -> tuple[bool, dict[str, Net]]:
    """The oracle: `collapse` of the window as read from the buffer, each net change by its key,
    its images as the buffer's text when they are a change's image (they must pass unchanged)."""
    originals: dict[int, str] = {}
    changes = []
    for event in events:
        old, new = text(event.old), text(event.new)
        change = buffer_change(event.action.value, None, old, new, fields)
        for image, original in ((change.old, old), (change.new, new)):
            if image is not None and original is not None:
                originals[id(image)] = original
        changes.append(change)
    net = collapse(changes, fields)

    def image_text(image: Row | None) -> str | None:
        return None if image is None else originals.get(id(image)) or text(image)

    truncated = bool(net) and net[0].action is Action.TRUNCATE
    return truncated, {key_json(identity(c, fields)): (c.action.value, c.key, image_text(c.old), image_text(c.new))
                       for c in (net[1:] if truncated else net)}
