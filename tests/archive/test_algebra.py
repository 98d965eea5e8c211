"""The change algebra: `apply` (laredo's reader semantics) and `collapse` (net change per key).

Named examples pin each collapse rule, including its before-image; hypothesis then checks the
defining property on random valid histories: applying the collapsed window equals applying the raw
window, from the start state the history was generated against.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshot_assets.archive.algebra import (
    Collapser,
    MalformedChange,
    TableState,
    apply,
    collapse,
    identity,
)
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.keys import laredo_row_key, row_key, typed_key

ID = ("id",)
TENANT_ID = ("tenant", "id")
TRUNCATE = Change(Action.TRUNCATE)


def r(key: Any, v: Any = "a", fields: Sequence[str] = ID) -> Row:
    """A row with key `key` (a tuple for composite keys) and payload `v`."""
    values = key if len(fields) > 1 else (key,)
    return {**dict(zip(fields, values, strict=True)), "v": v}


def ins(new: Row, fields: Sequence[str] = ID) -> Change:
    return Change(Action.INSERT, laredo_row_key(new, fields), new=new)


def upd(old: Row | None, new: Row, fields: Sequence[str] = ID) -> Change:
    return Change(Action.UPDATE, laredo_row_key(new, fields), old=old, new=new)


def dele(old: Row, fields: Sequence[str] = ID) -> Change:
    return Change(Action.DELETE, laredo_row_key(old, fields), old=old)


def state_of(*rows: Row, fields: Sequence[str] = ID) -> TableState:
    return {typed_key(row, fields): row for row in rows}


def applied(start: TableState, changes: Sequence[Change], fields: Sequence[str] = ID) -> TableState:
    state = dict(start)
    apply(state, changes, fields)
    return state


def assert_same_effect(start: TableState, raw: Sequence[Change], fields: Sequence[str] = ID) -> None:
    assert applied(start, collapse(raw, fields), fields) == applied(start, raw, fields)


# apply


def test_apply_follows_laredo_reader_semantics() -> None:
    state = state_of(r(1), r(2))
    apply(state, [ins(r(3)), upd(r(1), r(1, "b")), dele(r(2)), dele(r(9)), ins(r(3, "c"))], ID)
    assert state == state_of(r(1, "b"), r(3, "c"))
    apply(state, [TRUNCATE, ins(r(4))], ID)
    assert state == state_of(r(4))


def test_apply_key_changing_update_removes_the_old_key() -> None:
    assert applied(state_of(r(1), r(2)), [upd(r(1), r(5, "moved"))]) == state_of(r(2), r(5, "moved"))


def test_apply_update_with_a_partial_old_image_is_not_a_key_change() -> None:
    # REPLICA IDENTITY USING INDEX sends only the index columns as `old`.
    assert applied(state_of(r(1)), [upd({"v": "a"}, r(1, "b"))]) == state_of(r(1, "b"))


def test_apply_imageless_delete_is_keyed_by_its_key_string() -> None:
    big = r(1_000_000)
    assert applied(state_of(big, r(2)), [Change(Action.DELETE, "1e+06")]) == state_of(r(2))
    assert identity(Change(Action.DELETE, "[acme 7]"), TENANT_ID) == ("acme", 7)


@pytest.mark.parametrize("action", [Action.INSERT, Action.UPDATE])
def test_insert_or_update_without_new_row_is_malformed(action: Action) -> None:
    bad = Change(action, "1", old=r(1))
    with pytest.raises(MalformedChange, match="no new row"):
        apply({}, [bad], ID)
    with pytest.raises(MalformedChange):
        collapse([bad], ID)


# collapse: one rule per test


@pytest.mark.parametrize("change", [ins(r(1)), upd(r(1), r(1, "b")), dele(r(1)), TRUNCATE])
def test_a_single_change_is_its_own_net_change(change: Change) -> None:
    assert collapse([change], ID) == [change]


def test_insert_then_update_is_an_insert_of_the_final_row() -> None:
    assert collapse([ins(r(1)), upd(r(1), r(1, "b")), upd(r(1, "b"), r(1, "c"))], ID) == [ins(r(1, "c"))]


def test_insert_then_delete_is_nothing() -> None:
    assert collapse([ins(r(1)), upd(r(1), r(1, "b")), dele(r(1, "b"))], ID) == []


def test_delete_then_insert_is_an_update_from_the_deleted_row() -> None:
    assert collapse([dele(r(1)), ins(r(1, "b"))], ID) == [upd(r(1), r(1, "b"))]


def test_update_then_update_keeps_the_first_old_and_the_last_new() -> None:
    raw = [upd(r(1), r(1, "b")), upd(r(1, "b"), r(1, "c")), upd(r(1, "c"), r(1, "d"))]
    assert collapse(raw, ID) == [upd(r(1), r(1, "d"))]


def test_update_then_delete_is_a_delete_of_the_first_old() -> None:
    assert collapse([upd(r(1), r(1, "b")), dele(r(1, "b"))], ID) == [dele(r(1))]


def test_delete_insert_delete_is_a_delete_of_the_original_row() -> None:
    assert collapse([dele(r(1)), ins(r(1, "b")), dele(r(1, "b"))], ID) == [dele(r(1))]


def test_key_change_is_a_delete_of_the_old_key_and_an_insert_of_the_new() -> None:
    assert collapse([upd(r(1), r(2))], ID) == [dele(r(1)), ins(r(2))]


def test_key_change_parts_collapse_with_their_keys() -> None:
    assert collapse([ins(r(1)), upd(r(1), r(2)), upd(r(2), r(2, "b"))], ID) == [ins(r(2, "b"))]
    assert collapse([upd(r(1), r(2)), dele(r(2))], ID) == [dele(r(1))]
    # Moved away and back: the key's net change is an UPDATE, the transit key nets to nothing.
    assert collapse([upd(r(1), r(2, "b")), upd(r(2, "b"), r(1, "c"))], ID) == [upd(r(1), r(1, "c"))]


def test_key_swap_through_a_temporary_key() -> None:
    one, two = r(1, "one"), r(2, "two")
    raw = [upd(one, r(3, "one")), upd(two, r(1, "two")), upd(r(3, "one"), r(2, "one"))]
    assert collapse(raw, ID) == [upd(one, r(1, "two")), upd(two, r(2, "one"))]
    assert_same_effect(state_of(one, two), raw)


def test_update_with_a_partial_old_image_keeps_that_image_and_its_key() -> None:
    raw = [upd({"v": "a"}, r(1, "b")), upd({"v": "b"}, r(1, "c"))]
    assert collapse(raw, ID) == [upd({"v": "a"}, r(1, "c"))]
    partial_then_delete = collapse([upd({"v": "a"}, r(1, "b")), dele(r(1, "b"))], ID)
    # A DELETE must name its key: the partial before-image is completed with the key's values.
    assert partial_then_delete == [Change(Action.DELETE, "1", old={"v": "a", "id": 1})]


def test_truncate_comes_first_and_drops_what_it_wipes() -> None:
    raw = [ins(r(1)), upd(r(2), r(2, "b")), TRUNCATE, ins(r(3)), ins(r(1, "again"))]
    assert collapse(raw, ID) == [TRUNCATE, ins(r(3)), ins(r(1, "again"))]


def test_after_a_truncate_keys_start_absent() -> None:
    raw = [TRUNCATE, ins(r(1)), upd(r(1), r(1, "b")), ins(r(2)), dele(r(2))]
    assert collapse(raw, ID) == [TRUNCATE, ins(r(1, "b"))]


def test_truncates_collapse_to_one() -> None:
    assert collapse([TRUNCATE, ins(r(1)), TRUNCATE, TRUNCATE, ins(r(2))], ID) == [TRUNCATE, ins(r(2))]


def test_output_is_ordered_by_first_appearance() -> None:
    raw = [ins(r(3)), upd(r(1), r(1, "b")), dele(r(2)), upd(r(3), r(3, "b")), ins(r(2, "b"))]
    assert [c.key for c in collapse(raw, ID)] == ["3", "1", "2"]


def test_composite_keys() -> None:
    a1, b1 = r(("acme", 1), "x", TENANT_ID), r(("beta", 1), "y", TENANT_ID)
    a1b = r(("acme", 1), "x2", TENANT_ID)
    raw = [ins(a1, TENANT_ID), ins(b1, TENANT_ID), upd(a1, a1b, TENANT_ID), dele(b1, TENANT_ID)]
    out = collapse(raw, TENANT_ID)
    assert out == [ins(a1b, TENANT_ID)]
    assert out[0].key == "[acme 1]"
    big = r(("acme", 1_000_000), "z", TENANT_ID)
    assert collapse([ins(big, TENANT_ID)], TENANT_ID)[0].key == "[acme 1e+06]"


def test_ids_beyond_2_53_stay_distinct() -> None:
    # Both print 9.007199254740992e+15 as laredo keys; the fold uses exact typed identities.
    lo, hi = r(2**53), r(2**53 + 1)
    out = collapse([ins(lo), ins(hi), upd(hi, r(2**53 + 1, "b"))], ID)
    assert out == [ins(lo), ins(r(2**53 + 1, "b"))]
    assert out[0].key == out[1].key == "9.007199254740992e+15"
    assert applied({}, out) == state_of(lo, r(2**53 + 1, "b"))


def test_key_strings_are_laredo_doubles_by_default() -> None:
    row = r(1_000_000)
    assert collapse([Change(Action.INSERT, "1000000", new=row)], ID)[0].key == "1e+06"
    assert collapse([ins(r(1_234_567))], ID)[0].key == "1.234567e+06"
    assert collapse([ins(r(100_000))], ID)[0].key == "100000"
    assert collapse([ins(row)], ID, key_string=row_key)[0].key == "1000000"
    assert collapse([dele(row)], ID)[0].key == "1e+06"


def test_imageless_delete_keeps_the_source_key_string() -> None:
    bare = Change(Action.DELETE, "1000000")
    assert collapse([bare], ID) == [bare]
    assert_same_effect(state_of(r(1_000_000)), [bare])


def test_update_without_old_image_stays_an_update() -> None:
    # PostgreSQL's default replica identity sends no `old` for an update that keeps the key.
    raw = [upd(None, r(1_000_000, "b")), dele(r(1_000_000, "b"))]
    assert collapse([raw[0]], ID) == [upd(None, r(1_000_000, "b"))]
    # The net DELETE names its key with a key-only before-image, exact beyond 2^53 too.
    assert collapse(raw, ID) == [Change(Action.DELETE, "1e+06", old={"id": 1_000_000})]
    assert_same_effect(state_of(r(1_000_000)), raw)
    beyond = [upd(None, r(2**53 + 1, "b")), dele(r(2**53 + 1, "b"))]
    assert collapse(beyond, ID) == [Change(Action.DELETE, "9.007199254740992e+15", old={"id": 2**53 + 1})]
    assert_same_effect(state_of(r(2**53), r(2**53 + 1)), beyond)


def test_collapse_streams_an_iterator() -> None:
    def changes() -> Iterator[Change]:
        for i in range(1000):
            yield upd(r(i % 3, i), r(i % 3, i + 1))

    assert collapse(changes(), ID) == [upd(r(0, 0), r(0, 1000)), upd(r(1, 1), r(1, 998)),
                                       upd(r(2, 2), r(2, 999))]


def test_collapser_can_be_fed_incrementally() -> None:
    collapser = Collapser(ID)
    collapser.add(ins(r(1)))
    assert collapser.changes() == [ins(r(1))]
    collapser.add(dele(r(1)))
    assert collapser.changes() == []


# collapse: inconsistent sources


def test_update_of_a_key_never_inserted_stays_an_update() -> None:
    raw = [upd(r(1), r(1, "b"))]
    assert collapse(raw, ID) == raw
    assert_same_effect({}, raw)  # apply sets the key either way
    assert_same_effect(state_of(r(1)), raw)


def test_delete_of_a_missing_key_stays_a_delete() -> None:
    raw = [dele(r(1))]
    assert collapse(raw, ID) == raw
    assert_same_effect({}, raw)


def test_insert_of_a_key_already_updated_folds_into_its_update() -> None:
    raw = [upd(r(1), r(1, "b")), ins(r(1, "c"))]
    assert collapse(raw, ID) == [upd(r(1), r(1, "c"))]
    assert_same_effect(state_of(r(1)), raw)


def test_update_after_truncate_becomes_an_insert() -> None:
    raw = [TRUNCATE, upd(r(1), r(1, "b")), dele(r(2))]
    assert collapse(raw, ID) == [TRUNCATE, ins(r(1, "b"))]
    assert_same_effect(state_of(r(1), r(2)), raw)


def test_insert_of_a_present_key_then_delete_is_the_one_validity_assumption() -> None:
    # Documented: insert→delete nets to nothing, which assumes the key was absent before the INSERT.
    raw = [ins(r(1, "dup")), dele(r(1, "dup"))]
    assert collapse(raw, ID) == []
    assert applied(state_of(r(1)), raw) == {}
    assert applied(state_of(r(1)), collapse(raw, ID)) == state_of(r(1))


# Properties over random histories.

SINGLE_KEYS: list[Any] = [1, 2, 3, 1_000_000, 2**53, 2**53 + 1, "k"]
COMPOSITE_KEYS: list[Any] = [(t, i) for t in ("acme", "beta") for i in (1, 1_000_000, 2**53 + 1)]
PAYLOADS = st.integers(0, 2)
KEYSPACES = st.sampled_from([(ID, SINGLE_KEYS), (TENANT_ID, COMPOSITE_KEYS)])
# Weights; truncates only in half the windows, so before-images of UPDATE/DELETE get exercised too.
VALID_OPS = ["insert"] * 3 + ["update"] * 4 + ["delete"] * 2 + ["move"] * 2 + ["truncate"]


@st.composite
def valid_histories(draw: st.DrawFn) -> tuple[tuple[str, ...], TableState, list[Change]]:
    """A key space, a start state, and a window of changes a primary-keyed source could send."""
    fields, keys = draw(KEYSPACES)
    current: dict[Any, Row] = {k: r(k, draw(PAYLOADS), fields) for k in keys if draw(st.booleans())}
    start = {typed_key(row, fields): row for row in current.values()}
    changes: list[Change] = []
    truncates = draw(st.booleans())
    for _ in range(draw(st.integers(0, 30))):
        present = [k for k in keys if k in current]
        absent = [k for k in keys if k not in current]
        allowed = {"insert": bool(absent), "update": bool(present), "delete": bool(present),
                   "move": bool(present and absent), "truncate": truncates}
        op = draw(st.sampled_from([op for op in VALID_OPS if allowed[op]]))
        if op == "truncate":
            current.clear()
            changes.append(TRUNCATE)
            continue
        source = draw(st.sampled_from(absent if op == "insert" else present))
        target = draw(st.sampled_from(absent)) if op == "move" else source
        new = r(target, draw(PAYLOADS), fields)
        old = current.pop(source, None)
        if op == "delete":
            assert old is not None
            changes.append(dele(old, fields))
            continue
        changes.append(ins(new, fields) if old is None else upd(old, new, fields))
        current[target] = new
    return fields, start, changes


SETTINGS = settings(max_examples=400, deadline=None)


@SETTINGS
@given(valid_histories())
def test_collapsed_window_applies_like_the_raw_window(history: tuple[Any, TableState, list[Change]]) -> None:
    fields, start, raw = history
    assert_same_effect(start, raw, fields)


@SETTINGS
@given(valid_histories())
def test_collapse_emits_at_most_one_change_per_key(history: tuple[Any, TableState, list[Change]]) -> None:
    fields, _, raw = history
    out = collapse(raw, fields)
    body = out[1:] if out and out[0].action is Action.TRUNCATE else out
    assert all(c.action is not Action.TRUNCATE for c in body)
    identities = [identity(c, fields) for c in body]
    assert len(identities) == len(set(identities))


@SETTINGS
@given(valid_histories())
def test_collapse_before_images_are_the_start_rows(history: tuple[Any, TableState, list[Change]]) -> None:
    fields, start, raw = history
    out = collapse(raw, fields)
    truncated = bool(out) and out[0].action is Action.TRUNCATE
    for change in out[1:] if truncated else out:
        key = identity(change, fields)
        if change.action is Action.INSERT:
            assert truncated or key not in start
            assert change.old is None
        else:
            assert not truncated
            assert change.old == start[key]
        image = change.new if change.new is not None else change.old
        assert change.key == laredo_row_key(image, fields)


@SETTINGS
@given(valid_histories())
def test_collapse_is_idempotent(history: tuple[Any, TableState, list[Change]]) -> None:
    fields, _, raw = history
    once = collapse(raw, fields)
    assert collapse(once, fields) == once


@st.composite
def arbitrary_histories(draw: st.DrawFn) -> tuple[tuple[str, ...], TableState, list[Change]]:
    """Any sequence of well-formed changes (inserts of present keys, updates of absent ones, ...)
    and a start state in which every key the window INSERTs or moves into is absent: the one
    assumption `collapse` makes about its input."""
    fields, keys = draw(KEYSPACES)
    rows = st.builds(lambda k, v: r(k, v, fields), st.sampled_from(keys), PAYLOADS)
    change = st.one_of(
        st.builds(lambda new: ins(new, fields), rows),
        st.builds(lambda old, new: upd(old, new, fields), st.one_of(st.none(), rows), rows),
        st.builds(lambda old: dele(old, fields), rows),
        st.builds(lambda old: Change(Action.DELETE, row_key(old, fields)), rows),
        st.just(TRUNCATE),
    )
    changes = draw(st.lists(change, max_size=30))
    entered = {identity(c, fields) for c in changes if c.action is Action.INSERT or (
        c.action is Action.UPDATE and c.old is not None and typed_key(c.old, fields) != identity(c, fields))}
    start_rows = draw(st.lists(rows, max_size=len(keys)))
    start = {typed_key(row, fields): row for row in start_rows if typed_key(row, fields) not in entered}
    return fields, start, changes


@SETTINGS
@given(arbitrary_histories())
def test_collapse_is_exact_on_inconsistent_sources(history: tuple[Any, TableState, list[Change]]) -> None:
    fields, start, raw = history
    assert_same_effect(start, raw, fields)
    once = collapse(raw, fields)
    assert collapse(once, fields) == once
