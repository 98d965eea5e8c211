"""What the next artifact of a table is: the re-base trigger sensor's decision, from cheap reads only.

Inputs are the manifest (what is committed) and the buffer index statistics since the head (what
is pending) — both read in milliseconds — and the policy. The boundary of a diff is the buffer's
durable position, which always falls on a source transaction end (the buffer seals only there).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from resources.buffer import BufferStats
from resources.subscribers.events import SCHEMA_CHANGE
from snapshot_assets.archive.manifest import Manifest
from snapshot_assets.archive.policy import Policy, TriggerState, decide


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


NOTHING = NextArtifact("none", "", None, None)
SNAPSHOT_ONLY_TRIGGERS = frozenset({"initial", "resync", "schema_change"})
"""Triggers after which no diff can be written: the archive's state does not continue into the buffer."""


def parse_time(text: str) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def trigger_state(m: Manifest, pending: BufferStats, now: _dt.datetime) -> TriggerState:
    """laredo's trigger inputs, computed from the manifest and the buffer instead of memory."""
    snap = m.latest_snapshot()
    assert snap is not None
    created = parse_time(snap.created_at)
    since = now - created if created else _dt.timedelta.max
    after = m.artifacts[m.artifacts.index(snap) + 1:]
    committed_churn = sum(a.change_count for a in after)
    sizes = [ref.size_bytes for ref in snap.formats.values() if ref.size_bytes]
    return TriggerState(
        since_snapshot=since,
        diff_bytes=pending.bytes,
        churn_records=committed_churn + pending.changes,
        dataset_size=snap.row_count,
        last_snapshot_bytes=min(sizes) if sizes else 0,
        changes_pending=pending.changes,
    )


def next_artifact(m: Manifest, pending: BufferStats, policy: Policy, now: _dt.datetime, *,
                  force: bool = False) -> NextArtifact:
    """The decision for one table; `pending` must be the buffer's stats since the manifest head."""
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
        return NextArtifact("snapshot", "forced", None, durable)
    state = trigger_state(m, pending, now)
    if durable == head:
        state = TriggerState(state.since_snapshot, 0, state.churn_records, state.dataset_size,
                             state.last_snapshot_bytes, 0)
    decision = decide(policy, state)
    if decision.kind == "snapshot":
        return NextArtifact("snapshot", decision.trigger, None, durable)
    if decision.kind == "diff" and durable != head:
        return NextArtifact("diff", "diff_interval", head, durable)
    return NOTHING
