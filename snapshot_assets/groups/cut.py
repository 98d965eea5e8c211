"""One group tick: plan the cut, bring every member to it, publish it in the group manifest.

Members are built and committed one after the other with their own `TablePipeline` (the same
build, the same manifest compare-and-swap as a table outside a group), so every table manifest
stays laredo's and usable alone. The cut is published only after all of them committed and each
one was checked against it (`plan.member_cut`). A member that fails (an exception, a killed run)
leaves the group manifest as it was: the members already committed keep their artifacts, the next
tick plans a later cut from where each member is, and that cut is published once all reach it.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from resources.destinations.base import Destination
from snapshot_assets.archive.manifest import Artifact, utc_now
from snapshot_assets.archive.positions import comparator
from snapshot_assets.archive.reader import plan_as_of
from snapshot_assets.config import SnapshotterConfig
from snapshot_assets.groups.manifest import (
    Cut,
    GroupManifest,
    group_manifest_key,
    publish_cut,
    read_group_manifest,
)
from snapshot_assets.groups.model import GroupConfig
from snapshot_assets.groups.plan import CutPlan, Hold, member_cut, plan_cut
from snapshot_assets.pipeline.table import TablePipeline


class CutHeldBack(RuntimeError):
    """The cut cannot be published: a member did not reach it (named in the message)."""


@dataclass
class CutOutcome:
    """What a tick did: the cut it published (None: held back or nothing to do, `reason` says why)
    and the artifacts it committed on the way."""

    cut: Cut | None
    reason: str = ""
    committed: list[tuple[str, Artifact]] = field(default_factory=list)


class GroupPipeline:
    """A group's members (their pipelines) and its manifest, on the members' destinations."""

    def __init__(self, group: GroupConfig, members: Sequence[TablePipeline]) -> None:
        self.cfg = group
        self.name = group.name
        self.members = list(members)
        self.cmp = comparator("lsn")
        key = group_manifest_key(group.key_prefix)
        unique: dict[str, Destination] = {}
        for pipe in self.members:  # every destination any member writes to, each once
            for dest in pipe.destinations:
                unique.setdefault(dest.uri(key), dest)
        self.destinations = list(unique.values())

    @classmethod
    def of(cls, config: SnapshotterConfig, name: str) -> GroupPipeline:
        group = config.group(name)
        return cls(group, [TablePipeline(config.table(t)) for t in group.tables])

    def manifest(self) -> GroupManifest:
        return read_group_manifest(self.destinations, self.cfg.key_prefix, self.name, self.cfg.tables, self.cmp)

    def plan(self, now: _dt.datetime | None = None) -> CutPlan | Hold:
        return plan_cut(self.members, self.manifest().last, self.cmp, now)

    def advance(self, spark: Any, now: _dt.datetime | None = None) -> CutOutcome:
        """Plan, build and commit every member's step, then publish the cut (module doc)."""
        plan = self.plan(now)
        if isinstance(plan, Hold):
            return CutOutcome(None, plan.reason)
        committed: list[tuple[str, Artifact]] = []
        for pipe in self.members:
            step = plan.steps[pipe.name]
            if step.kind == "none":
                continue
            try:
                built = pipe.build(spark, step)
                pipe.commit(built.artifact)
            except Exception as exc:
                raise CutHeldBack(f"group {self.name}: the cut at {plan.position} is held back: {pipe.name} "
                                  f"failed ({step.kind} to {step.to_position}): {type(exc).__name__}: {exc}") from exc
            committed.append((pipe.name, built.artifact))
        return CutOutcome(self.publish(plan.position), "", committed)

    def publish(self, position: str) -> Cut:
        """Publish the cut at `position` once every member reached it; else CutHeldBack."""
        places = {}
        for pipe in self.members:
            place = member_cut(pipe, position)
            if isinstance(place, Hold):
                raise CutHeldBack(f"group {self.name}: the cut at {position} is held back: {place.reason}")
            places[pipe.name] = place
        cut = Cut(position, utc_now(), places)
        publish_cut(self.destinations, self.cfg.key_prefix, self.name, self.cfg.tables, cut, self.cmp,
                    readable=self._readable)
        return cut

    def _readable(self, m: GroupManifest) -> list[Cut]:
        """The cuts every member's manifest can still rebuild (retention prunes old epochs)."""
        manifests = {pipe.name: pipe.manifest() for pipe in self.members}

        def rebuilds(name: str, to_position: str) -> bool:
            found = plan_as_of(manifests[name], to_position, self.cmp)
            return found is not None and found.snapshot is not None and found.head_position == to_position

        return [c for c in m.cuts if all(rebuilds(n, mc.to_position) for n, mc in c.tables.items() if n in manifests)]
