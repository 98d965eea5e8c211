"""Row images as the replication stream sends them: column text, typed only when someone looks.

Why: converting every column of every change to a Python value and then to Go's JSON took two
thirds of the ingest's CPU, on the one process that must keep up with the source. The stream's
text is already exact (every connection runs with `pgtypes.SESSION_SETTINGS`), so the buffer
keeps it as it came, with the name of each column's converter (a `RowCodec`), and the build
types and encodes it in its own tasks (`resources.buffer.segments.with_images`), with the very
converters and encoder ingest used before: the bytes of the archive do not depend on where the
conversion ran.

A `TextChange` is a `ChangeEvent` whose `old` and `new` are computed from the text on access, so
every consumer of events (tests, the decode benchmark, `fill_unchanged`) sees the usual rows. A
`TextSnapshotRow` is the same for a row of the initial copy or a re-sync: the copy is the table,
so typing and encoding it on the ingest path bounded an initial snapshot at the speed of one
Python thread; kept as text, it is encoded in the build's tasks, column by column.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from resources.subscribers import pgtypes
from resources.subscribers.events import ChangeEvent, SnapshotRow
from snapshot_assets.archive.changes import Action, Row

TextValues = tuple[str | None, ...]
"""One image's column texts in table order (None: SQL NULL, or a column the image lacks), or,
for a key-only before-image, its key columns' texts in key order."""


@dataclass(frozen=True, slots=True)
class RowCodec:
    """How column texts become a row: column names in table order, each one's converter spec
    (`pgtypes.converter_of`) and the key columns (in key order)."""

    names: tuple[str, ...]
    specs: tuple[str, ...]
    key: tuple[str, ...]
    text: str = field(init=False, compare=False)
    _converters: tuple[pgtypes.Converter, ...] = field(init=False, compare=False, repr=False)
    _key_index: tuple[int, ...] = field(init=False, compare=False, repr=False)
    _int_key: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.names) != len(self.specs) or not set(self.key) <= set(self.names):
            raise ValueError(f"inconsistent row codec: columns {self.names}, converters {self.specs}, key {self.key}")
        index = {name: i for i, name in enumerate(self.names)}
        object.__setattr__(self, "text", json.dumps([self.names, self.specs, self.key], separators=(",", ":")))
        object.__setattr__(self, "_converters", tuple(pgtypes.converter_of(s) for s in self.specs))
        object.__setattr__(self, "_key_index", tuple(index[k] for k in self.key))
        object.__setattr__(self, "_int_key", all(self.specs[i] == "int" for i in self._key_index))

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def from_text(text: str) -> RowCodec:
        """The codec `text` describes (a segment's `codec` column; rows of one table shape share it)."""
        names, specs, key = json.loads(text)
        return RowCodec(tuple(names), tuple(specs), tuple(key))

    def is_key_only(self, values: TextValues) -> bool:
        """A key-only before-image (REPLICA IDENTITY DEFAULT's old key) rather than a whole row."""
        return len(values) != len(self.names)

    def image(self, values: TextValues, absent: Sequence[str] = ()) -> Row:
        """The typed row of one image, without the columns it lacks (`absent`)."""
        if self.is_key_only(values):
            if len(values) != len(self.key):
                raise ValueError(f"an image of {len(values)} columns fits neither the {len(self.names)} columns "
                                 f"nor the {len(self.key)} key columns of the table")
            names, converters = self.key, tuple(self._converters[i] for i in self._key_index)
        else:
            names, converters = self.names, self._converters
        return {name: None if value is None else convert(value)
                for name, convert, value in zip(names, converters, values, strict=True) if name not in absent}

    def key_image(self, key_texts: TextValues) -> Row:
        """The typed key columns from their texts in key order (`key_texts`). Not `image`: when every
        column is a key column, a key's texts are as many as a whole image's, in another order."""
        return {name: None if value is None else self._converters[i](value)
                for name, i, value in zip(self.key, self._key_index, key_texts, strict=True)}

    def key_texts(self, values: TextValues) -> TextValues:
        """The key columns' texts of an image (whole or key-only), in key order."""
        if self.is_key_only(values):
            return values
        index = self._key_index
        if len(index) == 1:  # the usual key: no generator per change
            return (values[index[0]],)
        return tuple([values[i] for i in index])

    def fast_key(self, key_texts: TextValues) -> str | None:
        """The `key` column (`segments.key_text`) straight from the text when that is exact: integer
        keys, which PostgreSQL prints canonically. None: take the general path (which also
        explains a NULL key)."""
        if not self._int_key or None in key_texts:
            return None
        if len(key_texts) == 1:
            return f"[{key_texts[0]}]"
        return "[" + ",".join(key_texts) + "]"  # type: ignore[arg-type]  # None was excluded above

    def fast_keys(self, texts: pa.RecordBatch) -> pa.Array | None:
        """`fast_key` of every row of a batch of whole images (one string column per column, in
        `names` order), with Arrow kernels; None when any row needs the general path."""
        if not self._int_key or texts.num_columns != len(self.names):
            return None
        columns = [texts.column(i) for i in self._key_index]
        if any(column.null_count for column in columns):
            return None
        inner = columns[0] if len(columns) == 1 else pc.binary_join_element_wise(*columns, ",")
        return pc.binary_join_element_wise("[", inner, "]", "")


class TextChange(ChangeEvent):
    """A change whose images are still column text (see the module doc).

    `old_text`/`new_text` are None when the image is absent; `old_absent` names the columns the
    before-image lacks (unchanged TOASTed values the server did not send); `new` lacks the columns
    of `unchanged`, as for any change.
    """

    __slots__ = ("codec", "new_text", "old_absent", "old_text")
    sequence = 0  # hides the parent's slot: PostgreSQL has no sequence of its own

    codec: RowCodec
    old_text: TextValues | None
    new_text: TextValues | None
    old_absent: tuple[str, ...]

    def __init__(self, position: str, action: Action, codec: RowCodec, *, old_text: TextValues | None = None,
                 new_text: TextValues | None = None, old_absent: tuple[str, ...] = (),
                 commit_time: _dt.datetime | None = None, unchanged: tuple[str, ...] = ()) -> None:
        # Frozen: the slots are set through their descriptors, as the dataclass's own __init__
        # does through object.__setattr__ (one of these is built per change, so without the loop).
        _SET_POSITION(self, position)
        _SET_ACTION(self, action)
        _SET_COMMIT_TIME(self, commit_time)
        _SET_UNCHANGED(self, unchanged)
        _SET_CODEC(self, codec)
        _SET_OLD_TEXT(self, old_text)
        _SET_NEW_TEXT(self, new_text)
        _SET_OLD_ABSENT(self, old_absent)

    @property  # the parent's field, computed here
    def old(self) -> Row | None:
        return None if self.old_text is None else self.codec.image(self.old_text, self.old_absent)

    @property
    def new(self) -> Row | None:
        return None if self.new_text is None else self.codec.image(self.new_text, self.unchanged)

    def typed(self) -> ChangeEvent:
        """The same change with typed images (a plain `ChangeEvent`)."""
        return ChangeEvent(position=self.position, action=self.action, old=self.old, new=self.new,
                           commit_time=self.commit_time, unchanged=self.unchanged)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, ChangeEvent):
            return (self.position, self.action, self.old, self.new, self.commit_time, self.sequence, self.unchanged) \
                == (other.position, other.action, other.old, other.new, other.commit_time, other.sequence,
                    other.unchanged)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # rows are dicts, as for ChangeEvent


class TextSnapshotRow(SnapshotRow):
    """A row of the initial copy or a re-sync still as column text (see the module doc); `row`
    is typed on access, so consumers that want rows (the fan-out server, tests) get them."""

    __slots__ = ("codec", "texts")

    codec: RowCodec
    texts: TextValues

    def __init__(self, codec: RowCodec, texts: TextValues) -> None:
        _SET_ROW_CODEC(self, codec)
        _SET_TEXTS(self, texts)

    @property  # the parent's field, computed here
    def row(self) -> Row:
        return self.codec.image(self.texts)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, SnapshotRow):
            return self.row == other.row
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # rows are dicts, as for SnapshotRow


_SET_POSITION, _SET_ACTION, _SET_COMMIT_TIME, _SET_UNCHANGED = (
    ChangeEvent.__dict__[name].__set__ for name in ("position", "action", "commit_time", "unchanged"))
_SET_CODEC, _SET_OLD_TEXT, _SET_NEW_TEXT, _SET_OLD_ABSENT = (
    TextChange.__dict__[name].__set__ for name in ("codec", "old_text", "new_text", "old_absent"))
_SET_ROW_CODEC, _SET_TEXTS = (TextSnapshotRow.__dict__[name].__set__ for name in ("codec", "texts"))
