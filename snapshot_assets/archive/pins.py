"""Pinned snapshots (restore points): how a pin is written into the manifest, and found again.

A pin is an additive field of a snapshot artifact, `"pin": {"label", "pinned_at", "origin"}`:
laredo's readers ignore fields they do not know, and this project's manifest rewrite carries it
through (manifest.py keeps unknown fields), so a pinned archive stays readable by both. The
initial snapshot of a table is pinned with origin `initial`; a snapshot a user asked for (or
pinned afterwards) with origin `user`. Retention never removes a pinned snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from snapshot_assets.archive.errors import CorruptManifest, PositionError
from snapshot_assets.archive.manifest import Artifact, Manifest

PIN_FIELD = "pin"
ORIGIN_INITIAL = "initial"
ORIGIN_USER = "user"
ORIGINS = (ORIGIN_INITIAL, ORIGIN_USER)


@dataclass(frozen=True, slots=True)
class Pin:
    label: str
    pinned_at: str
    origin: str = ORIGIN_USER

    def to_json(self) -> dict[str, str]:
        return {"label": self.label, "pinned_at": self.pinned_at, "origin": self.origin}


def pin_of(art: Artifact) -> Pin | None:
    """The artifact's pin, None when it has none; a malformed pin is a corrupt manifest."""
    doc = art.extra.get(PIN_FIELD)
    if doc is None:
        return None
    fields = ("label", "pinned_at", "origin")
    if not isinstance(doc, Mapping) or not all(isinstance(doc.get(k, ""), str) for k in fields):
        raise CorruptManifest(f"{art.describe()}: {PIN_FIELD} must be an object of strings, got {doc!r}")
    origin = doc.get("origin") or ORIGIN_USER
    if origin not in ORIGINS:
        raise CorruptManifest(f"{art.describe()}: {PIN_FIELD}.origin must be one of "
                              f"{', '.join(ORIGINS)}, got {origin!r}")
    return Pin(label=doc.get("label", ""), pinned_at=doc.get("pinned_at", ""), origin=origin)


def with_pin(art: Artifact, pin: Pin | None) -> Artifact:
    """`art` pinned with `pin` (unpinned when None); only snapshots can be pinned."""
    if pin is not None and not art.is_snapshot:
        raise PositionError(f"{art.describe()} is a diff; only snapshots can be pinned")
    extra: dict[str, Any] = {k: v for k, v in art.extra.items() if k != PIN_FIELD}
    if pin is not None:
        extra[PIN_FIELD] = pin.to_json()
    return replace(art, extra=extra)


def is_pinned(art: Artifact) -> bool:
    return pin_of(art) is not None


def pinned(m: Manifest) -> list[tuple[Artifact, Pin]]:
    """Every pinned snapshot of the manifest with its pin, in manifest order."""
    out = []
    for art in m.snapshots():
        pin = pin_of(art)
        if pin is not None:
            out.append((art, pin))
    return out


def snapshot_labelled(m: Manifest, label: str) -> Artifact:
    """The pinned snapshot carrying `label` (the newest when several do); a clear error naming the
    labels the archive has when none does."""
    found = [art for art, pin in pinned(m) if pin.label == label]
    if not found:
        labels = sorted({pin.label for _, pin in pinned(m) if pin.label})
        raise PositionError(f"{m.table or 'the table'} has no snapshot labelled {label!r}; "
                            f"labels: {', '.join(labels) or 'none'}")
    return found[-1]


def snapshot_pin(m: Manifest, label: str, now: str) -> Pin | None:
    """The pin a new snapshot of `m` is committed with: the user's `label`, else `initial` for the
    table's first snapshot; None for a snapshot the policy made (a system snapshot)."""
    if label:
        return Pin(label=label, pinned_at=now, origin=ORIGIN_USER)
    if not m.artifacts:
        return Pin(label=ORIGIN_INITIAL, pinned_at=now, origin=ORIGIN_INITIAL)
    return None


def pin_at(m: Manifest, position: str, label: str, *, now: str, origin: str = ORIGIN_USER) -> Manifest:
    """`m` with the snapshot at `position` pinned as `label` (re-labelled when already pinned)."""
    index = _snapshot_index(m, position)
    arts = list(m.artifacts)
    arts[index] = with_pin(arts[index], Pin(label=label, pinned_at=now, origin=origin))
    return replace(m, artifacts=tuple(arts))


def unpin_at(m: Manifest, position: str) -> Manifest:
    """`m` with the pin of the snapshot at `position` removed: retention may prune it from the next commit."""
    index = _snapshot_index(m, position)
    if not is_pinned(m.artifacts[index]):
        raise PositionError(f"{m.artifacts[index].describe()} of {m.table} is not pinned")
    arts = list(m.artifacts)
    arts[index] = with_pin(arts[index], None)
    return replace(m, artifacts=tuple(arts))


def _snapshot_index(m: Manifest, position: str) -> int:
    """The index of the snapshot at `position`; a diff there, or nothing there, is a clear error."""
    found = [i for i, a in enumerate(m.artifacts) if a.to_position == position]
    for i in found:
        if m.artifacts[i].is_snapshot:
            return i
    if found:
        raise PositionError(f"{position} is the end of {m.artifacts[found[0]].describe()} in {m.table}, not a "
                            f"snapshot; only snapshots can be pinned (snapshots: {_positions(m)})")
    raise PositionError(f"{m.table} has no snapshot at {position!r} (snapshots: {_positions(m)})")


def _positions(m: Manifest) -> str:
    return ", ".join(a.to_position for a in m.snapshots()) or "none"
