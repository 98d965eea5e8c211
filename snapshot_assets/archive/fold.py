"""Folding artifacts into table state: snapshot rows, then whole diffs.

Which key a change touches (typed key of its row image, PK-changing UPDATEs, partial before-images)
is decided in one place, `algebra.key_effects`; this module only adds what folding a *diff
artifact* needs on top: a TRUNCATE anywhere in a diff takes effect before the diff's other changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from snapshot_assets.archive.algebra import TableState, key_effects
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.keys import TypedKey, typed_key


class FoldState:
    """A table's rows by typed key (exact integers), in first-insertion order."""

    def __init__(self, key_fields: Sequence[str]) -> None:
        self.key_fields = tuple(key_fields)
        self.table: TableState = {}

    def __len__(self) -> int:
        return len(self.table)

    def put(self, row: Row) -> None:
        """Add a snapshot row."""
        self.table[typed_key(row, self.key_fields)] = row

    def rows(self) -> Iterator[Row]:
        return iter(self.table.values())


def fold_diff(state: FoldState, changes: Iterable[Change]) -> None:
    """Apply one diff artifact, every TRUNCATE taking effect before the diff's other changes.

    One pass, no second read of the artifact: the diff's own effects are remembered, and when a
    TRUNCATE turns up the table becomes exactly those effects applied to an empty table — which is
    what "TRUNCATE first, then the rest in file order" yields. Memory is O(keys in the diff).
    """
    effects: dict[TypedKey, Row | None] = {}
    for change in changes:
        if change.action is Action.TRUNCATE:
            state.table = {k: r for k, r in effects.items() if r is not None}
            continue
        for effect in key_effects(change, state.key_fields):
            if effect.after is None:
                state.table.pop(effect.key, None)
            else:
                state.table[effect.key] = effect.after
            effects[effect.key] = effect.after
