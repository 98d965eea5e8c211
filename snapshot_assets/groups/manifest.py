"""The group manifest, `<group key_prefix>group.json`: the cuts a reader may read a group at.

```
{ "group_manifest_version": 1, "group": "ledger", "tables": ["public.accounts", "public.transfers"],
  "updated_at": "RFC 3339 UTC",
  "cuts": [ { "position": "0/1A2B3C4D", "created_at": "...",
              "tables": { "public.accounts":  { "epoch": 2, "to_position": "0/1A2B3C4D" },
                          "public.transfers": { "epoch": 1, "to_position": "0/1A2B0000" } } }, ... ] }
```
A cut at P says: every member's archive rebuilt at its `to_position` (an artifact boundary of
that table's own manifest, at or before P, with no change of the table in between) is the table
at P. Cuts are oldest first, their positions strictly increasing. The table manifests are not
touched by any of this: each stays laredo's and readable alone.

The file is the group's commit point and is written like a table manifest: read every
destination's copy, take the one furthest along (a copy that is not a prefix of it means two
writers diverged, refused), and compare-and-swap each copy that differs, so a destination left
behind by a crash is brought forward. A cut is published only after every member's artifact for it
is committed, so a crash at any instant leaves either the previous cuts or the new one, never a
cut a member cannot rebuild.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from resources.destinations.base import CASConflict, Destination
from snapshot_assets.archive.errors import ArchiveError, CorruptManifest, UnsupportedManifestVersion
from snapshot_assets.archive.manifest import utc_now
from snapshot_assets.archive.positions import Comparator

GROUP_MANIFEST_NAME = "group.json"
GROUP_MANIFEST_VERSION = 1


class GroupConflict(ArchiveError):
    """A cut cannot be published: the copies of the group manifest diverged, or the cut does not
    come after the last one."""


def group_manifest_key(key_prefix: str) -> str:
    return f"{key_prefix}{GROUP_MANIFEST_NAME}"


@dataclass(frozen=True)
class MemberCut:
    """A member's place in a cut: the epoch and `to_position` of its artifact that the cut reads."""

    epoch: int
    to_position: str


@dataclass(frozen=True)
class Cut:
    position: str
    created_at: str
    tables: Mapping[str, MemberCut]

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "created_at": self.created_at,
                "tables": {name: {"epoch": m.epoch, "to_position": m.to_position}
                           for name, m in sorted(self.tables.items())}}


@dataclass(frozen=True)
class GroupManifest:
    group: str
    tables: tuple[str, ...]
    cuts: tuple[Cut, ...] = ()
    updated_at: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def last(self) -> Cut | None:
        return self.cuts[-1] if self.cuts else None

    def cut_at(self, position: str | None, cmp: Comparator) -> Cut | None:
        """The newest cut at or before `position` (the newest cut when None)."""
        found = [c for c in self.cuts if position is None or cmp(c.position, position) <= 0]
        return found[-1] if found else None

    def with_cut(self, cut: Cut, cmp: Comparator, *, now: str | None = None) -> GroupManifest:
        """Appended after the last cut; a cut at the last cut's position is the one already there."""
        last = self.last
        if last is not None and cmp(cut.position, last.position) <= 0:
            raise GroupConflict(f"group {self.group}: a cut at {cut.position} does not come after the last cut "
                                f"at {last.position}")
        if set(cut.tables) != set(self.tables):
            raise GroupConflict(f"group {self.group}: a cut must name every member ({', '.join(self.tables)}), "
                                f"not {', '.join(sorted(cut.tables))}")
        return replace(self, cuts=(*self.cuts, cut), updated_at=now or utc_now())

    def keeping(self, readable: Iterable[Cut]) -> GroupManifest:
        """Only the cuts in `readable` (those every member's manifest can still rebuild)."""
        kept = {id(c) for c in readable}
        return replace(self, cuts=tuple(c for c in self.cuts if id(c) in kept))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"group_manifest_version": GROUP_MANIFEST_VERSION, "group": self.group,
                               "tables": list(self.tables), "updated_at": self.updated_at,
                               "cuts": [c.to_json() for c in self.cuts]}
        out.update(self.extra)
        return out

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), indent=2).encode()


def loads(data: bytes, *, source: str = "group manifest") -> GroupManifest:
    """Parse a group manifest, refusing a newer version and anything malformed (naming `source`)."""
    try:
        doc = json.loads(data)
        version = doc["group_manifest_version"]
        if not isinstance(version, int) or version > GROUP_MANIFEST_VERSION:
            raise UnsupportedManifestVersion(f"{source}: group_manifest_version {version!r} is newer than "
                                             f"{GROUP_MANIFEST_VERSION}")
        cuts = tuple(Cut(str(c["position"]), str(c["created_at"]),
                         {str(n): MemberCut(int(m["epoch"]), str(m["to_position"])) for n, m in c["tables"].items()})
                     for c in doc["cuts"])
        known = {"group_manifest_version", "group", "tables", "updated_at", "cuts"}
        return GroupManifest(str(doc["group"]), tuple(str(t) for t in doc["tables"]), cuts,
                             str(doc.get("updated_at", "")), {k: v for k, v in doc.items() if k not in known})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptManifest(f"{source}: not a group manifest: {exc}") from None


@dataclass(frozen=True)
class _Copy:
    dest: Destination
    revision: str | None
    manifest: GroupManifest | None


def _copies(destinations: Sequence[Destination], key_prefix: str) -> list[_Copy]:
    key = group_manifest_key(key_prefix)
    copies = []
    for dest in destinations:
        got = dest.get(key)
        parsed = loads(got.data, source=dest.uri(key)) if got else None
        copies.append(_Copy(dest, got.revision if got else None, parsed))
    return copies


def _furthest(copies: Sequence[_Copy], group: str, tables: Sequence[str], cmp: Comparator) -> GroupManifest:
    """The copy with the newest last cut; every other copy's cuts must be among its cuts, except
    older ones it has since let go (retention)."""
    present = [c.manifest for c in copies if c.manifest is not None]
    if not present:
        return GroupManifest(group, tuple(tables))
    best = present[0]
    for m in present[1:]:
        if m.last is not None and (best.last is None or cmp(m.last.position, best.last.position) > 0):
            best = m
    held = {c.position for c in best.cuts}
    first = best.cuts[0].position if best.cuts else None
    for c in copies:
        if c.manifest is None or c.manifest is best:
            continue
        if c.manifest.group != group:
            raise GroupConflict(f"{c.dest.name}: the group manifest there belongs to group {c.manifest.group!r}")
        stray = [x.position for x in c.manifest.cuts if x.position not in held
                 and (first is None or cmp(x.position, first) > 0)]
        if stray:
            raise GroupConflict(f"group manifests diverged: {c.dest.name} has a cut at {stray[0]} the furthest copy "
                                "lacks; two writers wrote this group — stop one and reconcile")
    return best


def read_group_manifest(destinations: Sequence[Destination], key_prefix: str, group: str,
                        tables: Sequence[str], cmp: Comparator) -> GroupManifest:
    """The furthest copy of the group manifest (an empty one when no destination holds it yet)."""
    return _furthest(_copies(destinations, key_prefix), group, tables, cmp)


def publish_cut(destinations: Sequence[Destination], key_prefix: str, group: str, tables: Sequence[str], cut: Cut,
                cmp: Comparator, *, readable: Callable[[GroupManifest], Iterable[Cut]] | None = None,
                max_attempts: int = 5) -> GroupManifest:
    """Append `cut` on every destination (compare-and-swap), keeping only the older cuts that
    `readable(manifest)` still lists (retention of the members may have pruned what a cut reads).

    Idempotent: a cut already published at that position only brings lagging copies forward.
    """
    for _attempt in range(max_attempts):
        copies = _copies(destinations, key_prefix)
        current = _furthest(copies, group, tables, cmp)
        if current.tables != tuple(tables):
            current = replace(current, tables=tuple(tables))
        done = current.last is not None and current.last.position == cut.position
        new = current if done else current.with_cut(cut, cmp)
        if readable is not None:
            new = new.keeping(readable(new))
        data = new.dumps()
        try:
            for c in copies:
                if c.manifest is not None and c.manifest.dumps() == data:
                    continue
                c.dest.put_if(group_manifest_key(key_prefix), data, c.revision)
        except CASConflict:
            continue
        return new
    raise GroupConflict(f"group {group}: gave up publishing the cut at {cut.position} after {max_attempts} "
                        "compare-and-swap conflicts")
