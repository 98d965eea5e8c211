"""A group's next cut: the watermark W and what each member must write to reach it.

Positions are commit LSNs of one database, so they compare across the members. A member is
complete through its buffer's durable position: its own transactions up to there are sealed, and
an idle member's durable position follows the source's keepalives (resources/subscribers/postgres.py,
"Idle progress"), so one quiet table does not stall the group. The watermark is the lowest durable
position of the members: every member holds every change through it.

Each member then reaches W by the same decision the per-table trigger makes (pipeline/decide.py),
asked as if the buffer ended at W: its initial snapshot (built from its copy plus its changes up
to W: the common first position), a snapshot the member's re-base policy or a re-sync calls for, a
diff (head, W] when it changed in between, or nothing when it did not. The member's chain then
ends at W, or at an earlier boundary with nothing of that table after it: either way it is the
table at W.

Nothing here writes: `plan_cut` reads manifests and buffer indexes (milliseconds), as a sensor may.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from resources.buffer.errors import ResyncInWindow
from snapshot_assets.archive.positions import Comparator
from snapshot_assets.groups.manifest import Cut, MemberCut
from snapshot_assets.pipeline.decide import NOTHING, NextArtifact, next_artifact
from snapshot_assets.pipeline.table import TablePipeline


@dataclass(frozen=True)
class Hold:
    """Why the group cannot cut now (the next tick asks again)."""

    reason: str


@dataclass(frozen=True)
class CutPlan:
    """The cut at `position` and, per member, the artifact that makes its chain reach it."""

    position: str
    steps: Mapping[str, NextArtifact]

    @property
    def writes(self) -> bool:
        return any(s.kind != "none" for s in self.steps.values())

    @property
    def run_key(self) -> str:
        """Names the cut (a sensor's run key; a retry adds its attempt)."""
        return f"cut:{self.position}"


def watermark(members: Sequence[TablePipeline], cmp: Comparator) -> str | Hold:
    """The lowest durable position of the members, once every one has one and it is at or past
    every member's head (a head past it would mean that member's archive is ahead of the others')."""
    durables: dict[str, str] = {}
    for pipe in members:
        durable = pipe.buffer().durable_position()
        if durable is None:
            return Hold(f"{pipe.name}: nothing durable in its buffer yet (initial load pending)")
        durables[pipe.name] = durable
    lowest = min(durables.values(), key=functools.cmp_to_key(cmp))
    for pipe in members:
        head = pipe.manifest().head_position
        if head and cmp(head, lowest) > 0:
            slow = next(name for name, durable in durables.items() if durable == lowest)
            return Hold(f"{slow}: ingest is at {lowest}, behind the head {head} of {pipe.name}")
    return lowest


def member_step(pipe: TablePipeline, position: str, now: _dt.datetime) -> NextArtifact | Hold:
    """What `pipe` writes so that its chain reaches `position` (module doc)."""
    cmp = pipe.cmp
    m = pipe.manifest()
    head = m.head_position or None
    if head == position:
        return NOTHING
    reader = pipe.buffer()
    resync = reader.latest_resync()
    fresh = resync is not None and (head is None or cmp(resync.end_position, head) > 0)
    if resync is not None and fresh and cmp(resync.end_position, position) > 0:
        if head is None:
            return Hold(f"{pipe.name}: its initial copy is at {resync.end_position}, after {position}")
        fresh = False  # the re-sync comes after the cut: a diff to the cut precedes it
    changes = 0
    if head is not None and not fresh:
        try:
            changes = sum(r.seq_to_inclusive - r.seq_from_exclusive for r in reader.segments(head, position))
        except ResyncInWindow:
            fresh = True
    pending = dataclasses.replace(reader.stats(head), durable_position=position, changes=changes,
                                  resync_pending=fresh, resync_reason=resync.reason if fresh and resync else "")
    return next_artifact(m, pending, pipe.cfg.policy, now, snapshot_format=pipe.cfg.snapshot_formats[0])


def plan_cut(members: Sequence[TablePipeline], last: Cut | None, cmp: Comparator,
             now: _dt.datetime | None = None) -> CutPlan | Hold:
    """The next cut of a group whose last published cut is `last` (module doc)."""
    w = watermark(members, cmp)
    if isinstance(w, Hold):
        return w
    if last is not None and cmp(w, last.position) <= 0:
        return Hold(f"nothing new: the watermark {w} is at the last cut")
    when = now or _dt.datetime.now(_dt.UTC)
    steps: dict[str, NextArtifact] = {}
    for pipe in members:
        step = member_step(pipe, w, when)
        if isinstance(step, Hold):
            return step
        steps[pipe.name] = step
    plan = CutPlan(w, steps)
    if last is not None and not plan.writes:
        return Hold(f"no member changed since the cut at {last.position}")
    return plan


def member_cut(pipe: TablePipeline, position: str) -> MemberCut | Hold:
    """`pipe`'s place in the cut at `position`, checked: its head is at the cut, or before it with no
    change of the table in between (else the member has not reached the cut: its run failed)."""
    m = pipe.manifest()
    head = m.head_position
    if not head or not m.artifacts:
        return Hold(f"{pipe.name}: no snapshot yet")
    if pipe.cmp(head, position) > 0:
        return Hold(f"{pipe.name}: its head {head} is past the cut at {position}")
    if head != position:
        try:
            pending = pipe.buffer().segments(head, position)
        except ResyncInWindow:
            return Hold(f"{pipe.name}: a re-sync before {position} is not archived yet")
        if pending:
            return Hold(f"{pipe.name}: changes after its head {head} are not archived up to {position}")
    return MemberCut(m.artifacts[-1].epoch, head)
