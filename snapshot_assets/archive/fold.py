"""Folding changes into table state: the one place that decides which row a change touches.

Identity is the typed key of the change's row image (new for INSERT/UPDATE, old for DELETE), so
folding never depends on the `%v` key string; the string is only consulted for a change that
carries no row image at all. A primary-key-changing UPDATE (old and new keys differ) removes the
old identity, which is how PostgreSQL reports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.keys import TypedKey, parse_key_string, typed_key


class FoldState:
    """A table's rows by typed key, in first-insertion order."""

    def __init__(self, key_fields: Sequence[str]) -> None:
        self.key_fields = tuple(key_fields)
        self._rows: dict[TypedKey, Row] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def key_of(self, row: Row) -> TypedKey:
        return typed_key(row, self.key_fields)

    def put(self, row: Row) -> None:
        self._rows[self.key_of(row)] = row

    def get(self, key: TypedKey) -> Row | None:
        return self._rows.get(key)

    def rows(self) -> Iterator[Row]:
        return iter(self._rows.values())

    def snapshot(self) -> dict[TypedKey, Row]:
        """A copy of the state, for comparisons in tests and checks."""
        return dict(self._rows)

    def identity(self, change: Change) -> TypedKey:
        """The key a change writes (INSERT/UPDATE) or removes (DELETE)."""
        image = change.new if change.action in (Action.INSERT, Action.UPDATE) else change.old
        if image is None:
            image = change.old or change.new
        if image is not None:
            return self.key_of(image)
        return parse_key_string(change.key, len(self.key_fields))

    def apply(self, change: Change) -> None:
        """Apply one change with laredo's reader semantics."""
        if change.action is Action.TRUNCATE:
            self._rows.clear()
            return
        key = self.identity(change)
        if change.action is Action.DELETE:
            self._rows.pop(key, None)
            return
        if change.new is None:
            raise ValueError(f"{change.action.value} of key {change.key!r} carries no new row")
        if change.action is Action.UPDATE and change.old is not None:
            old_key = self.key_of(change.old)
            if old_key != key:
                self._rows.pop(old_key, None)
        self._rows[key] = change.new

    def apply_all(self, changes: Iterable[Change]) -> None:
        for change in changes:
            self.apply(change)


def fold_diff(state: FoldState, changes: Iterable[Change]) -> None:
    """Apply one diff artifact with every TRUNCATE taking effect before the diff's other changes.

    One pass, no second read of the artifact: the diff's own effects are tracked, and when a
    TRUNCATE turns up the state becomes exactly those effects applied to an empty table — which
    is what "TRUNCATE first, then the rest in file order" yields. Memory is O(keys in the diff).
    """
    effects: dict[TypedKey, Row | None] = {}
    for change in changes:
        if change.action is Action.TRUNCATE:
            state._rows = {k: r for k, r in effects.items() if r is not None}
            continue
        key = state.identity(change)
        old_key = state.key_of(change.old) if change.action is Action.UPDATE and change.old else None
        state.apply(change)
        if old_key is not None and old_key != key:
            effects[old_key] = None
        effects[key] = state.get(key)
