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
