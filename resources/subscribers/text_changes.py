"""Changes kept as column text (`text_rows.TextChange`) → their images and derived columns, column by column.

Why: a diff reads its window's changes from the buffer, where a PostgreSQL change is still its
column text (resources/buffer/segments.py says why), and turns each into exactly the buffer row
`segments.encode_change` writes for the typed change. Row by row (type every value, encode both
images, compute laredo's key string) that cost about 116 µs a change: 15-22 s of the 2-core build
of a diff of 100,000 changes, however few net changes they fold into. Here a batch of changes of
one table shape is encoded with the copy's column kernels (`text_columns.encode_column`), and the
derived columns follow from the shapes of the images.

Which changes are encoded here (`encode_changes` says which it did; `encode_change`, the
definition, does the others one by one):
- INSERT with a whole new image and no before-image;
- UPDATE with a whole new image (no unchanged TOASTed values omitted) and either no before-image
  (REPLICA IDENTITY DEFAULT) or a whole or key-only one naming the same key (the same key texts):
  a primary-key change goes row by row;
- DELETE with a whole or key-only before-image (DEFAULT sends the key columns only);
- a before-image with no absent columns (`old_absent`);
- and only while every value is one the kernels' typed path accepts: a refused value sends the
  whole batch row by row, where the refusal names its column and row.

What the derived columns of such a change are (`segments.derived_columns` of it):
  old_key, old_change_key  null: it changes no primary key
  change_key       laredo's `%v` of the key values as Go reads them back (`keys.laredo_row_key`) of
                   the new image, else the old one: integer keys of at most 15 digits (exact as a
                   double: the digits, in exponent form from 1e+06 on), text and boolean keys are
                   spelled by kernels; any other key by `laredo_row_key`, one row at a time
  old_partial      the before-image is absent, or holds nothing but key columns
  old_carries_key  the before-image is present (whole or key-only, it holds every key column)
tests/buffer/test_text_changes.py holds this module to `encode_change`, column by column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from resources.subscribers.text_columns import REFUSED, columns_of, encode_column, joined_rows, spread
from resources.subscribers.text_rows import RowCodec
from snapshot_assets.archive import gojson
from snapshot_assets.archive.keys import laredo_row_key

#: The columns `encode_changes` fills (`segments._IMAGE_COLUMNS`, in that order).
IMAGE_COLUMNS = ("old", "new", "old_key", "change_key", "old_change_key", "old_partial", "old_carries_key")
_TYPES = {"old_partial": pa.bool_(), "old_carries_key": pa.bool_()}
# An integer of at most 15 digits is exact as a double; from 1e6 on Go's %v writes it in exponent form.
_SHORT_INT = r"^(0|-?[1-9][0-9]{0,14})$"
_EXPONENT_FROM = 6


class EncodedChanges(NamedTuple):
    """What `encode_changes` made of a batch: which rows (`done`), and for those rows, in order,
    the value of each of IMAGE_COLUMNS."""

    done: pa.Array
    columns: dict[str, pa.Array]


def encode_changes(codec: RowCodec, actions: pa.Array, old_texts: pa.Array, new_texts: pa.Array,
                   old_absent: pa.Array, unchanged: pa.Array) -> EncodedChanges:
    """The images and derived columns of the changes of one table shape (`codec`) that this module
    encodes (see the module docstring), and which those are."""
    width, key_width = len(codec.names), len(codec.key)
    new_len = pc.fill_null(pc.list_value_length(new_texts), -1)
    old_len = pc.fill_null(pc.list_value_length(old_texts), -1)
    whole_new = pc.equal(new_len, width)
    no_old = pc.equal(old_len, -1)
    old_whole = pc.equal(old_len, width)
    old_keyed = pc.and_(pc.equal(old_len, key_width), pc.not_equal(old_len, width))
    some_old = pc.or_(old_whole, old_keyed)
    same_key = _same_key_texts(codec, old_texts, new_texts, old_whole, old_keyed)
    insert = pc.and_(pc.equal(actions, "INSERT"), pc.and_(whole_new, no_old))
    update = pc.and_(pc.equal(actions, "UPDATE"),
                     pc.and_(whole_new, pc.or_(no_old, pc.and_(some_old, same_key))))
    delete = pc.and_(pc.equal(actions, "DELETE"), pc.and_(pc.equal(new_len, -1), some_old))
    plain = pc.and_(pc.is_null(old_absent), pc.is_null(unchanged))
    done = pc.fill_null(pc.and_(plain, pc.or_(insert, pc.or_(update, delete))), False)
    if not pc.any(done).as_py():
        return _nothing(len(actions))
    old_texts, new_texts = old_texts.filter(done), new_texts.filter(done)
    old_whole, old_keyed = old_whole.filter(done), old_keyed.filter(done)
    try:
        new = _images(codec.names, codec.specs, new_texts, pc.is_valid(new_texts))
        old = pc.if_else(old_whole, _images(codec.names, codec.specs, old_texts, old_whole),
                         _images(codec.key, _key_specs(codec), old_texts, old_keyed))
    except REFUSED:
        return _nothing(len(actions))  # row by row, where the refusal names its column and row
    rows = len(new)
    key_source = pc.if_else(pc.is_valid(new_texts), new_texts, old_texts)
    change_key = _change_keys(codec, key_source, pc.is_valid(new_texts), old_keyed)
    present = pc.is_valid(old_texts)
    partial = pc.invert(present) if width != key_width else pa.array(np.ones(rows, dtype=bool))
    return EncodedChanges(done, {
        "old": old, "new": new, "old_key": pa.nulls(rows, pa.string()), "change_key": change_key,
        "old_change_key": pa.nulls(rows, pa.string()),
        "old_partial": pc.or_(partial, old_keyed), "old_carries_key": present})


def _nothing(rows: int) -> EncodedChanges:
    return EncodedChanges(pa.array(np.zeros(rows, dtype=bool)),
                          {name: pa.nulls(0, _TYPES.get(name, pa.string())) for name in IMAGE_COLUMNS})


def _key_specs(codec: RowCodec) -> tuple[str, ...]:
    index = {name: i for i, name in enumerate(codec.names)}
    return tuple(codec.specs[index[name]] for name in codec.key)


def _key_columns(codec: RowCodec, texts: pa.Array, keyed: pa.Array | None = None) -> list[pa.Array]:
    """The key columns' texts of each image, in key order: a whole image's from its key positions,
    a key-only one's (where `keyed`) as they are. Null where the image is absent or of another width."""
    index = {name: i for i, name in enumerate(codec.names)}
    columns = []
    for k, name in enumerate(codec.key):
        whole = pc.list_element(pc.if_else(pc.equal(pc.list_value_length(texts), len(codec.names)), texts,
                                           pa.scalar(None, texts.type)), index[name])
        if keyed is not None:
            own = pc.list_element(pc.if_else(keyed, texts, pa.scalar(None, texts.type)), k)
            whole = pc.coalesce(whole, own)
        columns.append(whole)
    return columns


def _same_key_texts(codec: RowCodec, old_texts: pa.Array, new_texts: pa.Array, old_whole: pa.Array,
                    old_keyed: pa.Array) -> pa.Array:
    """Whether a present before-image holds the new image's key texts (no primary-key change)."""
    safe_old = pc.if_else(pc.or_(old_whole, old_keyed), old_texts, pa.scalar(None, old_texts.type))
    same = pa.array(np.ones(len(old_texts), dtype=bool))
    for old, new in zip(_key_columns(codec, safe_old, old_keyed), _key_columns(codec, new_texts), strict=True):
        same = pc.and_(same, pc.fill_null(pc.equal(old, new), False))
    return same


def _images(names: Sequence[str], specs: Sequence[str], texts: pa.Array, where: pa.Array) -> pa.Array:
    """The Go-JSON text of the images at `where` (each `len(names)` texts of those columns), null elsewhere."""
    rows = len(texts)
    if not pc.any(where).as_py():
        return pa.nulls(rows, pa.string())
    chosen = texts.filter(where)
    columns = [encode_column(column, spec) for column, spec in zip(columns_of(chosen, len(names)), specs, strict=True)]
    return spread(joined_rows(names, columns), where)


def _change_keys(codec: RowCodec, texts: pa.Array, whole: pa.Array, keyed: pa.Array) -> pa.Array:
    """laredo's key string of each image in `texts` (whole where `whole`, else whole or key-only)."""
    parts = []
    spelled = pa.array(np.ones(len(texts), dtype=bool))
    for column, spec in zip(_key_columns(codec, texts, pc.and_(pc.invert(whole), keyed)), _key_specs(codec),
                            strict=True):
        part, exact = _go_v(column, spec)
        parts.append(part)
        spelled = pc.and_(spelled, exact)
    inner = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, " ")
    keys = inner if len(parts) == 1 else pc.binary_join_element_wise("[", inner, "]", "")
    rest = pc.invert(spelled)
    if pc.any(rest).as_py():
        spare = [gojson.valid_text(laredo_row_key(codec.key_image(tuple(values)), codec.key))
                 for values in zip(*(c.filter(rest).to_pylist() for c in _key_columns(codec, texts, keyed)),
                                   strict=True)]
        keys = pc.replace_with_mask(pc.if_else(spelled, keys, pa.scalar(None, pa.string())), rest,
                                    pa.array(spare, pa.string()))
    return keys


def _go_v(values: pa.Array, spec: str) -> tuple[pa.Array, pa.Array]:
    """Go's `%v` of each key value as laredo's reader holds it (`keys.go_json_value`), and where
    the kernel spells it exactly (elsewhere the part is a placeholder)."""
    present = pc.is_valid(values)
    if spec == "text":
        return pc.fill_null(values, ""), present
    if spec == "bool":
        exact = pc.fill_null(pc.is_in(values, pa.array(["t", "f"])), False)
        return pc.if_else(pc.equal(values, "t"), "true", "false").fill_null(""), exact
    if spec != "int":
        return pa.array([""] * len(values), pa.string()), pa.array(np.zeros(len(values), dtype=bool))
    exact = pc.fill_null(pc.match_substring_regex(values, _SHORT_INT), False)
    digits = pc.if_else(exact, values, "0")
    negative = pc.starts_with(digits, "-")
    magnitude = pc.if_else(negative, pc.utf8_slice_codeunits(digits, 1), digits)
    exponent = pc.subtract(pc.utf8_length(magnitude), 1)
    significant = pc.utf8_rtrim(magnitude, "0")
    tail = pc.utf8_slice_codeunits(significant, 1)
    mantissa = pc.if_else(pc.equal(tail, ""), pc.utf8_slice_codeunits(significant, 0, 1),
                          pc.binary_join_element_wise(pc.utf8_slice_codeunits(significant, 0, 1), tail, "."))
    scientific = pc.binary_join_element_wise(pc.if_else(negative, "-", ""), mantissa, "e+",
                                             pc.utf8_lpad(pc.cast(exponent, pa.string()), 2, "0"), "")
    return pc.if_else(pc.less(exponent, _EXPONENT_FROM), digits, scientific), exact


__all__ = ["IMAGE_COLUMNS", "EncodedChanges", "encode_changes"]
