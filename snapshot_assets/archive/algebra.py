"""The change algebra: applying changes to a keyed table state, and collapsing a window of changes.

`apply` is the meaning of a diff: laredo's reader semantics (spec §4), applied in order. `collapse`
turns an ordered window of raw source changes into one net change per key so that a diff is as
small as the table's net movement, never as long as the source's history.

Why the before-images matter: a diff consumer that is not a plain state folder (an audit log, a
CDC bridge, a cache invalidator) reads `old` as "what the row was before this diff". So the net
UPDATE/DELETE of a key must carry the row as it was at the *start* of the window, which is the
`old` image of the key's *first* change, never of its last; and a key that did not exist at the
start must come out as an INSERT (no `old`), whatever happened to it in between.

Pure Python, no Spark. The Spark diff job states the same rules as SQL over (key, seq)
(`spark/effects.py`: explode changes into their `key_effects`, group them by key in source order,
keep each key's first and last effect as `KeyNet` does, write `KeyNet.to_change`; a TRUNCATE in the
window splits it, see `Collapser.add`); a property test holds the two equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.errors import ArchiveError
from snapshot_assets.archive.keys import TypedKey, laredo_row_key, parse_key_string, typed_key

KeyString = Callable[[Mapping[str, Any] | None, Sequence[str]], str]
"""Builds the `key` string written with a change from its row image (`keys.laredo_row_key`)."""

TableState = dict[TypedKey, Row]
"""A table as a fold target: typed row identity -> row."""


class MalformedChange(ArchiveError, ValueError):
    """A change that cannot mean anything: an INSERT or UPDATE without a `new` row."""


def identity(change: Change, key_fields: Sequence[str]) -> TypedKey:
    """The row a change is about: its `new` image's key, else its `old` image's, else its key string.

    The key string is only the last resort (a DELETE without a usable before-image) because it is
    the lossy Go `%v` text: typed identities keep integers beyond 2^53 exact.
    """
    if change.new is not None:
        return typed_key(change.new, key_fields)
    old_key = _old_key(change, key_fields)
    return old_key if old_key is not None else parse_key_string(change.key, len(key_fields))


def _old_key(change: Change, key_fields: Sequence[str]) -> TypedKey | None:
    """The key of the `old` image, if it names one.

    A source may send a partial before-image (PostgreSQL's REPLICA IDENTITY USING INDEX sends only
    the index columns); one that lacks a key field names no key, and reading it as a `<nil>` key
    would turn an ordinary UPDATE into a bogus primary-key change.
    """
    old = change.old
    if old is None or any(f not in old for f in key_fields):
        return None
    return typed_key(old, key_fields)


def apply(state: TableState, changes: Iterable[Change], key_fields: Sequence[str]) -> None:
    """Apply changes to `state` in order, in place, as laredo's reader does.

    INSERT and UPDATE set the key to `new`, DELETE removes the key, TRUNCATE clears the table. An
    UPDATE whose `old` image has a different key (a primary-key change) also removes the old key:
    laredo never writes one (its buffer splits nothing), but a raw source change can be one.
    Applying is total over well-formed changes: a DELETE of a missing key is a no-op and an
    INSERT of a present key overwrites it, exactly like laredo, so a diff never fails to fold.
    """
    for change in changes:
        if change.action is Action.TRUNCATE:
            state.clear()
            continue
        for effect in key_effects(change, key_fields):
            if effect.after is None:
                state.pop(effect.key, None)
            else:
                state[effect.key] = effect.after


@dataclass(frozen=True, slots=True)
class KeyEffect:
    """What one change does to one key; a key-changing UPDATE has two (delete old, insert new).

    `existed` is what the change asserts about the key before it: an INSERT says "absent", an
    UPDATE or DELETE says "present, and its row was `before`" (None when the source sent no
    `old`). `after` is the row the key holds afterwards, None when the change leaves it absent.
    `source_key` is the key string the source sent, the only name of a key without a row image.
    Exposed so a distributed fold can explode changes into effects and group them by `key`.
    """

    key: TypedKey
    existed: bool
    before: Row | None
    after: Row | None
    source_key: str


def key_effects(change: Change, key_fields: Sequence[str]) -> list[KeyEffect]:
    """Split a non-TRUNCATE change into its per-key effects, in the order they happen."""
    if change.action is Action.TRUNCATE:
        raise ValueError("a TRUNCATE affects every key; it has no per-key effects")
    if change.action is Action.DELETE:
        return [KeyEffect(identity(change, key_fields), True, change.old, None, change.key)]
    if change.new is None:
        raise MalformedChange(f"{change.action.value} change for key {change.key!r} has no new row")
    new_key = typed_key(change.new, key_fields)
    if change.action is Action.INSERT:
        return [KeyEffect(new_key, False, None, change.new, change.key)]
    old_key = _old_key(change, key_fields)
    if old_key is not None and old_key != new_key:
        return [KeyEffect(old_key, True, change.old, None, change.key),
                KeyEffect(new_key, False, None, change.new, change.key)]
    return [KeyEffect(new_key, True, change.old, change.new, change.key)]


@dataclass(slots=True)
class KeyNet:
    """The net movement of one key across a window: where it started and where it ended.

    `existed`/`before` come from the key's first effect in the window (after the last TRUNCATE)
    and never change afterwards: that first change is the only one that saw the start state.
    `after` follows every effect; None means the key ends absent. `delete_old` is what a net
    DELETE carries as `old` (see `_named_before`), `source_key` the key string the source sent.
    """

    existed: bool
    before: Row | None
    after: Row | None
    delete_old: Row | None
    source_key: str

    @classmethod
    def start(cls, effect: KeyEffect, *, truncated: bool, key_fields: Sequence[str]) -> KeyNet:
        """Open a key at its first effect; after a TRUNCATE every key starts absent."""
        if truncated or not effect.existed:
            return cls(False, None, effect.after, None, effect.source_key)
        return cls(True, effect.before, effect.after, _named_before(effect, key_fields), effect.source_key)

    def fold(self, effect: KeyEffect) -> None:
        """Move the end state; the start state stays what the first effect saw."""
        self.after = effect.after

    def to_change(self, key_string: KeyString, key_fields: Sequence[str]) -> Change | None:
        """The one change that takes this key from its start state to its end state, or None.

        start absent, end present: INSERT new (covers insert→update, and after a TRUNCATE).
        start present, end present: UPDATE first old → last new (update→update, delete→insert).
        start present, end absent: DELETE with the first old (update→delete).
        start absent, end absent: nothing (insert→delete).
        """
        if self.after is not None:
            action = Action.UPDATE if self.existed else Action.INSERT
            return Change(action, key_string(self.after, key_fields), old=self.before, new=self.after)
        if not self.existed:
            return None
        old = self.delete_old
        key = key_string(old, key_fields) if carries_key(old, key_fields) else self.source_key
        return Change(Action.DELETE, key, old=old)


def _named_before(effect: KeyEffect, key_fields: Sequence[str]) -> Row | None:
    """The `old` for a net DELETE of a key: the start row, completed with its key values if needed.

    A DELETE must name its key exactly, and only a row image can (the key string is lossy beyond
    2^53). When the source sent no before-image, or one without the key columns (an UPDATE under
    PostgreSQL's default replica identity), the key's first `new` image supplies the key values:
    it is the same key, so they are the values the row had; the rest of `old` stays as sent.
    """
    before, image = effect.before, effect.after
    if carries_key(before, key_fields) or image is None:
        return before
    return {**(before or {}), **{f: image.get(f) for f in key_fields}}


def carries_key(row: Row | None, key_fields: Sequence[str]) -> bool:
    """The image holds every key field: it names its key exactly."""
    return row is not None and all(f in row for f in key_fields)


def partial_image(image: Row | None, key_fields: Sequence[str]) -> bool:
    """An absent before-image, or one holding no column beyond the key columns: what PostgreSQL
    sends under REPLICA IDENTITY DEFAULT; the row it stands for is completed from the archive."""
    return image is None or set(image) <= set(key_fields)


class Collapser:
    """Streaming form of `collapse`: feed changes in source order, then read the net changes.

    Memory is one `KeyNet` per distinct key touched since the last TRUNCATE, never one per change.
    """

    def __init__(self, key_fields: Sequence[str], *, key_string: KeyString = laredo_row_key) -> None:
        self._key_fields = tuple(key_fields)
        self._key_string = key_string
        self._truncated = False
        self._nets: dict[TypedKey, KeyNet] = {}

    def add(self, change: Change) -> None:
        """Fold one change into the window.

        A TRUNCATE forgets every key seen so far (the TRUNCATE wipes them, and it is written first)
        and makes every later key start absent: whatever a later change claims about the key's
        past, the table was empty right after the TRUNCATE, so the key's net change is an INSERT.
        """
        if change.action is Action.TRUNCATE:
            self._truncated = True
            self._nets.clear()
            return
        for effect in key_effects(change, self._key_fields):
            net = self._nets.get(effect.key)
            if net is None:
                self._nets[effect.key] = KeyNet.start(effect, truncated=self._truncated,
                                                      key_fields=self._key_fields)
            else:
                net.fold(effect)

    def changes(self) -> list[Change]:
        """The net changes: TRUNCATE first if the window had one, then keys by first appearance."""
        out = [Change(Action.TRUNCATE)] if self._truncated else []
        for net in self._nets.values():
            change = net.to_change(self._key_string, self._key_fields)
            if change is not None:
                out.append(change)
        return out


def collapse(
    changes: Iterable[Change], key_fields: Sequence[str], *, key_string: KeyString = laredo_row_key
) -> list[Change]:
    """Collapse an ordered window of raw source changes into at most one net change per key.

    Applying the output in order gives the same table as applying the input in order, from any
    start state in which the input is valid (a source with a primary key never INSERTs a present
    key, nor UPDATEs or DELETEs an absent one). Each output change touches only its own key, so
    the order of the per-key changes does not affect the result; it is made deterministic anyway
    (first appearance) so the same window always encodes to the same bytes.

    A key-changing UPDATE counts as a DELETE of the old key and an INSERT of the new one, and each
    part collapses with the other changes of its key: insert 1 then move 1→2 is an INSERT of 2.

    Inconsistent input (from a source that breaks its own key): the end state of every key is
    still exact from every start state, because the last change of a key alone decides it (INSERT
    and UPDATE set, DELETE removes, as `apply` does). Only one rule relies on validity: a key
    whose first change in the window is an INSERT (or the new key of a key-changing UPDATE) and
    which ends absent is dropped; if the key did exist before the window, the raw changes delete
    it and the collapsed ones leave it. UPDATE or DELETE of a key never inserted stays an UPDATE
    or DELETE; an INSERT of a key already updated in the window becomes part of its UPDATE.

    The `key` of each output is `key_string` of its row image (`new`, or `old` for a DELETE): by
    default laredo's double-keyed string, so laredo's reader folds our diffs onto its snapshots.
    A net DELETE whose before-image lacks the key columns gets them from the key's first `new`
    image (see `_named_before`); one with no image at all keeps the key string the source sent.
    """
    collapser = Collapser(key_fields, key_string=key_string)
    for change in changes:
        collapser.add(change)
    return collapser.changes()
