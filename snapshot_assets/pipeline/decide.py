"""What the next artifact of a table is: the re-base trigger sensor's decision.

Inputs are the manifest (what is committed) and the buffer index statistics since the head (what
is pending) — both read in milliseconds — and the policy. The boundary of a diff is the buffer's
durable position, which always falls on a source transaction end (the buffer seals only there).

The size triggers (`max_diff_bytes`, `max_diff_fraction`) judge the encoded size of the diff that
would be written, in the diff's primary format. That is not in any index: a caller that can run
Spark passes `diff_size` (pipeline/diff_size.py), which is asked only when the size can change
the decision (`policy.diff_size_matters`). A caller without Spark (`snapshotter status`) gets the
buffer's bytes since the head as a stand-in.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Callable
from dataclasses import dataclass

from resources.buffer import BufferStats
from resources.subscribers.events import SCHEMA_CHANGE
from snapshot_assets.archive.manifest import Artifact, Manifest
from snapshot_assets.archive.policy import Policy, TriggerState, decide, diff_size_matters
from snapshot_assets.archive.positions import Comparator


@dataclass(frozen=True)
class NextArtifact:
    kind: str  # "snapshot" | "diff" | "none"
    trigger: str
    from_position: str | None
    to_position: str | None

    @property
    def run_key(self) -> str:
        """Run keys name the boundary: Dagster deduplicates run keys forever, so never the bare table."""
        return f"{self.kind}:{self.from_position or '-'}:{self.to_position}"


DiffSize = Callable[[str, str], int]
"""(from, to) -> the encoded bytes of the diff (from, to] in the table's primary diff format."""

NOTHING = NextArtifact("none", "", None, None)

FORCED = "forced"
"""The trigger of a snapshot a user asked for (UI, GraphQL, HTTP, CLI): made even at the head."""

SNAPSHOT_ONLY_TRIGGERS = frozenset({"initial", "resync", "schema_change"})
"""Triggers after which no diff can be written: the archive's state does not continue into the buffer."""


def parse_time(text: str) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def trigger_state(m: Manifest, pending: BufferStats, now: _dt.datetime,
                  snapshot_format: str | None = None) -> TriggerState:
    """laredo's trigger inputs, computed from the manifest and the buffer instead of memory."""
    snap = m.latest_snapshot()
    assert snap is not None
    created = parse_time(snap.created_at)
    since = now - created if created else _dt.timedelta.max
    after = m.artifacts[m.artifacts.index(snap) + 1:]
    committed_churn = sum(a.change_count for a in after)
    return TriggerState(
        since_snapshot=since,
        diff_bytes=pending.bytes,  # a stand-in: next_artifact measures the diff when it matters
        churn_records=committed_churn + pending.changes,
        dataset_size=snap.row_count,
        last_snapshot_bytes=primary_size(snap, snapshot_format),
        changes_pending=pending.changes,
    )


def primary_size(snap: Artifact, snapshot_format: str | None) -> int:
    """The snapshot's size in its primary format (the table's first snapshot format); a caller that
    does not name it, or a snapshot written without it, gets the smallest of its formats."""
    ref = snap.formats.get(snapshot_format) if snapshot_format else None
    if ref is not None:
        return ref.size_bytes
    sizes = [r.size_bytes for r in snap.formats.values() if r.size_bytes]
    return min(sizes) if sizes else 0


def next_artifact(m: Manifest, pending: BufferStats, policy: Policy, now: _dt.datetime, *,
                  force: bool = False, diff_size: DiffSize | None = None,
                  snapshot_format: str | None = None) -> NextArtifact:
    """The decision for one table; `pending` must be the buffer's stats since the manifest head.

    `diff_size` measures the diff that would be written; it is called at most once, and only when
    its answer can change the decision (module doc). `snapshot_format` is the table's primary
    snapshot format, whose size `max_diff_fraction` compares with.
    """
    durable = pending.durable_position
    if durable is None:
        return NOTHING
    head = m.head_position or None
    if m.latest_snapshot() is None:
        return NextArtifact("snapshot", "initial", None, durable)
    if pending.resync_pending:
        trigger = "schema_change" if pending.resync_reason == SCHEMA_CHANGE else "resync"
        return NextArtifact("snapshot", trigger, None, durable)
    if force:
        return NextArtifact("snapshot", FORCED, None, durable)
    state = trigger_state(m, pending, now, snapshot_format)
    if durable == head:
        state = dataclasses.replace(state, diff_bytes=0, changes_pending=0)
    elif diff_size is not None and diff_size_matters(policy, state):
        state = dataclasses.replace(state, diff_bytes=diff_size(m.head_position, durable))
    decision = decide(policy, state)
    if decision.kind == "snapshot":
        return NextArtifact("snapshot", decision.trigger, None, durable)
    if decision.kind == "diff" and durable != head:
        return NextArtifact("diff", "diff_interval", head, durable)
    return NOTHING


def still_due(requested: NextArtifact, m: Manifest, cmp: Comparator) -> NextArtifact | None:
    """What is left of an artifact a sensor requested, now that its run starts: itself, a diff
    re-planned from the current head, or None when the archive already covers it (superseded).

    A sensor fixes the boundary when it requests a run, but the run waits in the queue behind the
    table's other runs (one writer per table): a forced snapshot launched from the UI or GraphQL in
    the meantime moves the head. A diff then starts at the new head and keeps its end (its changes
    are still in the buffer: nothing is released past the head); a diff or a snapshot whose end the
    head has reached is not built at all. A re-base at the head's own position stays due unless the
    head is already a snapshot there (collapsing a chain of diffs is its purpose), and a forced one
    stays due there in any case: the user asked for a snapshot (perhaps to pin it)."""
    head = m.head_position
    if not head or requested.to_position is None:
        return requested
    ahead = cmp(head, requested.to_position)
    if requested.kind == "diff":
        if ahead >= 0:
            return None
        return requested if requested.from_position == head else dataclasses.replace(requested, from_position=head)
    last = m.artifacts[-1] if m.artifacts else None
    if ahead > 0 or (ahead == 0 and last is not None and last.is_snapshot and requested.trigger != FORCED):
        return None
    return requested
