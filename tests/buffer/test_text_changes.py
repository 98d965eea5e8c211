"""Column-wise images of changes kept as PostgreSQL text are the row-by-row path's, column for column.

The oracle is `segments.encode_change` of each typed change (`_changes_one_by_one` calls it): the
buffer rows ingest writes for generated changes (`_encode_text_change`, with its refusals) are read
back with `with_images`, which encodes what it can column by column (`text_changes`), and every
image and derived column must equal the oracle's, or both refuse the batch alike. The generated
changes cover the shapes PostgreSQL sends (REPLICA IDENTITY DEFAULT's absent or key-only
before-images, FULL's whole ones, primary-key changes, unchanged TOASTed values, before-images with
absent columns), composite keys and integer keys beyond 2^53.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resources.buffer.segments import _changes_one_by_one, _encode_text_change, record_batch, with_images
from resources.subscribers.events import Action
from resources.subscribers.text_changes import IMAGE_COLUMNS, encode_changes
from resources.subscribers.text_rows import RowCodec, TextChange
from snapshot_assets.archive.errors import ArchiveError
from tests.buffer.pg_texts import SPEC_TEXTS

_KEY_SPECS = ("int", "text", "bool", "float", "timestamptz")  # int, text and bool keys are spelled by kernels
_NAMES = st.lists(st.sampled_from(["id", "tenant", "name", "body", "n", "at", "doc", "a<b", "é"]), min_size=1,
                  max_size=5, unique=True)


@st.composite
def _codecs(draw: Any) -> RowCodec:
    names = draw(_NAMES)
    key = tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=min(2, len(names)), unique=True)))
    specs = tuple(draw(st.sampled_from(_KEY_SPECS if name in key else sorted(SPEC_TEXTS))) for name in names)
    return RowCodec(tuple(names), specs, key)


@st.composite
def _changes(draw: Any, codec: RowCodec) -> TextChange:
    def whole() -> tuple[str | None, ...]:
        return tuple(draw(SPEC_TEXTS[spec] if name in codec.key else st.none() | SPEC_TEXTS[spec])
                     for name, spec in zip(codec.names, codec.specs, strict=True))

    def key_only(of: tuple[str | None, ...] | None) -> tuple[str | None, ...]:
        if of is not None and draw(st.booleans()):
            return codec.key_texts(of)  # the same key: no primary-key change
        return tuple(draw(SPEC_TEXTS[codec.specs[codec.names.index(name)]]) for name in codec.key)

    def some_of(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(draw(st.lists(st.sampled_from(names), max_size=2, unique=True))) if names else ()

    action = draw(st.sampled_from([Action.INSERT, Action.UPDATE, Action.UPDATE, Action.DELETE, Action.TRUNCATE]))
    others = tuple(n for n in codec.names if n not in codec.key)
    new = whole() if action in (Action.INSERT, Action.UPDATE) else None
    old: tuple[str | None, ...] | None = None
    if action is Action.DELETE or (action is Action.UPDATE and draw(st.booleans())):
        shape = draw(st.sampled_from(["whole", "same", "key"]))
        if shape == "whole":
            old = whole()
        elif shape == "same" and new is not None:
            old = tuple(t if n not in codec.key else new[i] for i, (n, t) in enumerate(zip(codec.names, whole(),
                                                                                           strict=True)))
        else:
            old = key_only(new)
    unchanged = some_of(others) if action is Action.UPDATE and draw(st.booleans()) else ()
    if new is not None and unchanged:
        new = tuple(None if n in unchanged else t for n, t in zip(codec.names, new, strict=True))
    absent = some_of(others) if old is not None and len(old) == len(codec.names) and draw(st.booleans()) else ()
    return TextChange("0/1", action, codec, old_text=old, new_text=new, old_absent=absent, unchanged=unchanged)


def _buffered(changes: list[TextChange]) -> pa.RecordBatch | None:
    """The buffer rows ingest writes for `changes` (those it accepts)."""
    rows = []
    for seq, change in enumerate(changes, 1):
        try:
            rows.append(_encode_text_change(change, seq)[0])
        except (ArchiveError, ValueError):
            continue  # refused at ingest: never buffered
    return record_batch(rows) if rows else None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_changes_are_encoded_column_by_column_as_the_typed_path_encodes_each(data: Any) -> None:
    codec = data.draw(_codecs())
    batch = _buffered(data.draw(st.lists(_changes(codec), min_size=1, max_size=12)))
    if batch is None:
        return
    try:
        expected = _changes_one_by_one(batch, pc.is_valid(batch.column("codec")))
    except (ArchiveError, ValueError) as refused:
        with pytest.raises(type(refused)) as also:
            with_images(batch)
        assert str(also.value) == str(refused)
        return
    got = with_images(batch)
    for name in IMAGE_COLUMNS:
        assert got.column(name).to_pylist() == expected.column(name).to_pylist(), name


def test_the_usual_changes_of_a_table_are_encoded_column_by_column() -> None:
    """REPLICA IDENTITY DEFAULT's shapes (an UPDATE without a before-image, a DELETE with the key
    only), FULL's whole before-images, snowflake and 1e6-sized keys: all column by column; only a
    primary-key change and an UPDATE sparing a TOASTed value are left to the row-by-row path."""
    codec = RowCodec(("id", "name", "doc"), ("int", "text", "json"), ("id",))
    snowflake = str(2**62 + 12345)
    changes = [
        TextChange("0/1", Action.INSERT, codec, new_text=(snowflake, "a", '{"k": [1, 2]}')),
        TextChange("0/2", Action.UPDATE, codec, new_text=("1000000", "b", "null")),
        TextChange("0/3", Action.UPDATE, codec, old_text=("7", "x", "{}"), new_text=("7", "y", "{}")),
        TextChange("0/4", Action.DELETE, codec, old_text=("1234567",)),
        TextChange("0/5", Action.UPDATE, codec, old_text=("8",), new_text=("9", "moved", "{}")),
        TextChange("0/6", Action.UPDATE, codec, new_text=("10", "c", None), unchanged=("doc",)),
    ]
    batch = _buffered(changes)
    assert batch is not None
    encoded = encode_changes(codec, *(batch.column(n) for n in ("action", "old_text", "new_text", "old_absent",
                                                                  "unchanged")))
    assert encoded.done.to_pylist() == [True, True, True, True, False, False]
    assert encoded.columns["change_key"].to_pylist() == ["4.6116860184274e+18", "1e+06", "7",
                                                         "1.234567e+06"]
    assert encoded.columns["old"].to_pylist() == [None, None, '{"doc":{},"id":7,"name":"x"}', '{"id":1234567}']
    assert encoded.columns["old_partial"].to_pylist() == [True, True, False, True]
    assert encoded.columns["old_carries_key"].to_pylist() == [False, False, True, True]
    expected = _changes_one_by_one(batch, pc.is_valid(batch.column("codec")))
    got = with_images(batch)
    for name in IMAGE_COLUMNS:
        assert got.column(name).to_pylist() == expected.column(name).to_pylist(), name
