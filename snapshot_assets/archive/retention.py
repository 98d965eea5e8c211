"""Retention: which artifacts leave the manifest at a commit, and when their objects may be deleted.

Two rules on top of the epoch window (`Manifest.with_artifact(keep_epochs)`):
  * a pinned snapshot (archive/pins.py) never leaves the manifest through retention;
  * an artifact that left the manifest keeps its objects for `grace` more, so a consumer that was
    handed its URL just before (a bootstrap answer, an event) can still download it.

The artifacts waiting out their grace are recorded in the manifest itself, as the additive field
`"retired": [{kind, epoch, from_position, to_position, formats: [ids], retired_at}]`. The manifest
is the one record every host reads and the commit point: the same compare-and-swap that drops an
artifact records its retirement, so no crash can leave an object that is neither referenced nor
remembered (a record beside the buffer would need a second write, and a host without that
working root would never delete the object). laredo's readers ignore the field; this project's
manifest rewrite carries it through. Orphan collection treats a retired object as referenced.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from snapshot_assets.archive.errors import CorruptManifest
from snapshot_assets.archive.manifest import Artifact, FormatRef, Manifest, rfc3339
from snapshot_assets.archive.pins import is_pinned

RETIRED_FIELD = "retired"
DEFAULT_GRACE = _dt.timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Retention:
    """A table's retention: `keep_epochs` (0 keeps every epoch) and the grace of a retired object."""

    keep_epochs: int = 0
    grace: _dt.timedelta = _dt.timedelta(0)


@dataclass(frozen=True, slots=True)
class Retired:
    """An artifact that left the manifest at `retired_at`; its objects stay until the grace is over."""

    artifact: Artifact  # identity and format ids; URIs are not kept (keys follow from the identity)
    retired_at: str

    def to_json(self) -> dict[str, Any]:
        a = self.artifact
        return {"kind": a.kind, "epoch": a.epoch, "from_position": a.from_position, "to_position": a.to_position,
                "formats": sorted(a.formats), "retired_at": self.retired_at}

    def due(self, grace: _dt.timedelta, now: _dt.datetime) -> bool:
        return parse_time(self.retired_at) + grace <= now


@dataclass(frozen=True, slots=True)
class Retained:
    """The outcome of retention at one commit."""

    manifest: Manifest
    retired: tuple[Artifact, ...]  # left the manifest in this commit
    expired: tuple[Artifact, ...]  # grace over (retired now or before): delete their objects


def parse_time(text: str) -> _dt.datetime:
    try:
        moment = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise CorruptManifest(f"{RETIRED_FIELD}: retired_at {text!r} is not an RFC 3339 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=_dt.UTC)


def retired_of(m: Manifest) -> list[Retired]:
    """The manifest's retired artifacts (oldest first); a malformed record is a corrupt manifest."""
    doc = m.extra.get(RETIRED_FIELD)
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise CorruptManifest(f"{m.table}: {RETIRED_FIELD} must be a list, got {doc!r}")
    return [_retired(entry, i, m.table) for i, entry in enumerate(doc)]


def _retired(entry: Any, i: int, table: str) -> Retired:
    where = f"{table}: {RETIRED_FIELD}[{i}]"
    if not isinstance(entry, Mapping):
        raise CorruptManifest(f"{where} must be an object, got {entry!r}")
    kind, epoch, to, formats, at = (entry.get(k) for k in ("kind", "epoch", "to_position", "formats", "retired_at"))
    start = entry.get("from_position")
    if (not isinstance(kind, str) or not isinstance(epoch, int) or not isinstance(to, str)
            or not isinstance(at, str) or not isinstance(formats, list)
            or not all(isinstance(f, str) for f in formats) or not (start is None or isinstance(start, str))):
        raise CorruptManifest(f"{where}: expected kind, epoch, from_position, to_position, formats, retired_at; "
                              f"got {dict(entry)!r}")
    art = Artifact(kind=kind, epoch=epoch, from_position=start, to_position=to, created_at="",
                   formats={fid: FormatRef("", 0) for fid in formats})
    parse_time(at)
    return Retired(art, at)


def with_retired(m: Manifest, entries: Sequence[Retired]) -> Manifest:
    extra = {k: v for k, v in m.extra.items() if k != RETIRED_FIELD}
    if entries:
        extra[RETIRED_FIELD] = [e.to_json() for e in entries]
    return replace(m, extra=extra)


def commit_with_retention(current: Manifest, art: Artifact, retention: Retention, now: _dt.datetime) -> Retained:
    """`current` with `art` committed: the epoch window applied (pinned snapshots spared), what left
    recorded as retired, and every retired artifact whose grace is over dropped from the record."""
    new = current.with_artifact(art, now=rfc3339(now), keep_epochs=retention.keep_epochs, spare=_pinned_snapshot)
    kept = {a.identity for a in new.artifacts}
    left = [a for a in current.artifacts if a.identity not in kept]
    return expire(new, left, retention.grace, now)


def _pinned_snapshot(art: Artifact) -> bool:
    """Spared by retention: a pinned snapshot (a pin on a diff, from a hand-edited manifest, spares
    nothing: a diff kept without the artifacts before it would break the chain)."""
    return art.is_snapshot and is_pinned(art)


def expire(m: Manifest, leaving: Sequence[Artifact], grace: _dt.timedelta, now: _dt.datetime) -> Retained:
    """Record `leaving` as retired now; hand back every retired artifact whose grace is over."""
    entries = [*retired_of(m), *(Retired(a, rfc3339(now)) for a in leaving)]
    due = [e for e in entries if e.due(grace, now)]
    waiting = [e for e in entries if not e.due(grace, now)]
    return Retained(with_retired(m, waiting), tuple(leaving), tuple(e.artifact for e in due))
