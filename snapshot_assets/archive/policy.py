"""The re-base policy: when to write a fresh snapshot instead of another diff.

`should_snapshot` is laredo-snapshotter's decision function, transcribed exactly (same order, same
`>=` comparisons, same float arithmetic for the fractions, zero disables a trigger), so a table
configured the same way re-bases at the same moments under either tool. `decide` is the layer the
trigger sensor uses: it adds "nothing to write" and the idle-table ceiling that laredo lacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

_ZERO = timedelta(0)


@dataclass(frozen=True, slots=True)
class Policy:
    """Re-base thresholds; each one is independent and zero disables it (laredo's `Policy`).

    `diff_interval` is how often pending changes are flushed; the decision itself ignores it.
    `min_interval` is a floor between snapshots: inside it a diff is always written.
    `max_interval` forces a re-base once that long has passed since the last snapshot.
    `max_diff_bytes` / `max_diff_fraction` re-base when the encoded diff would be at least that
    many bytes / that fraction of the last snapshot's bytes; `max_churn_records` /
    `max_churn_fraction` when the changes since the last snapshot reach that count / that
    fraction of the table's row count.
    """

    diff_interval: timedelta = _ZERO
    min_interval: timedelta = _ZERO
    max_interval: timedelta = _ZERO
    max_diff_bytes: int = 0
    max_diff_fraction: float = 0.0
    max_churn_records: int = 0
    max_churn_fraction: float = 0.0


@dataclass(frozen=True, slots=True)
class TriggerState:
    """The live input to the decision (laredo's `triggerState`, plus `changes_pending`).

    `diff_bytes` is the encoded size of the diff that would be written now (laredo: "the serialized
    diff") in the primary diff format, the first configured one;
    `last_snapshot_bytes` the last snapshot's size in its primary format;
    `churn_records` counts changes since the last snapshot, including the pending ones;
    `changes_pending` counts the changes not yet in any artifact (laredo's non-empty buffer).
    """

    since_snapshot: timedelta
    diff_bytes: int = 0
    churn_records: int = 0
    dataset_size: int = 0
    last_snapshot_bytes: int = 0
    changes_pending: int = 0


Trigger = Literal[
    "max_interval", "max_diff_bytes", "max_diff_fraction", "max_churn_records", "max_churn_fraction"
]


def _inside_floor(policy: Policy, since_snapshot: timedelta) -> bool:
    """True while the min-interval floor forbids a snapshot."""
    return policy.min_interval > _ZERO and since_snapshot < policy.min_interval


def _past_ceiling(policy: Policy, since_snapshot: timedelta) -> bool:
    return policy.max_interval > _ZERO and since_snapshot >= policy.max_interval


def _at_fraction(value: int, fraction: float, whole: int) -> bool:
    """`value >= fraction * whole`, computed in float64 as Go does; disabled by a zero on either side."""
    return fraction > 0 and whole > 0 and float(value) >= fraction * float(whole)


def should_snapshot(policy: Policy, state: TriggerState) -> tuple[bool, str]:
    """Whether to re-base instead of writing a diff, and the name of the first trigger that fired.

    The floor wins over every trigger; then triggers are tried in laredo's order and the first
    match names the reason. `changes_pending` is not looked at: laredo only asks this question
    with a non-empty buffer (`decide` handles the empty one).
    """
    if _inside_floor(policy, state.since_snapshot):
        return False, ""
    checks: tuple[tuple[Trigger, bool], ...] = (
        ("max_interval", _past_ceiling(policy, state.since_snapshot)),
        ("max_diff_bytes", policy.max_diff_bytes > 0 and state.diff_bytes >= policy.max_diff_bytes),
        ("max_diff_fraction",
         _at_fraction(state.diff_bytes, policy.max_diff_fraction, state.last_snapshot_bytes)),
        ("max_churn_records",
         policy.max_churn_records > 0 and state.churn_records >= policy.max_churn_records),
        ("max_churn_fraction",
         _at_fraction(state.churn_records, policy.max_churn_fraction, state.dataset_size)),
    )
    for name, fired in checks:
        if fired:
            return True, name
    return False, ""


def diff_size_matters(policy: Policy, state: TriggerState) -> bool:
    """Whether the diff's size can change the decision, i.e. whether it is worth measuring.

    Measuring the diff that would be written is a Spark job over the pending changes, so the
    decision asks for it only when a size trigger is on and nothing cheaper already decided: with
    changes pending, outside the min-interval floor, and with max_interval (tried first) not firing.
    A fraction needs a last snapshot size to compare with.
    """
    if state.changes_pending <= 0 or _inside_floor(policy, state.since_snapshot):
        return False
    if _past_ceiling(policy, state.since_snapshot):
        return False
    return policy.max_diff_bytes > 0 or (policy.max_diff_fraction > 0 and state.last_snapshot_bytes > 0)


DecisionKind = Literal["snapshot", "diff", "none"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What the trigger sensor should request for a table at this tick, and why.

    `trigger` names the threshold that fired for a "snapshot"; it is "" otherwise.
    """

    kind: DecisionKind
    trigger: str = ""


NOTHING = Decision("none")
DIFF = Decision("diff")


def decide(policy: Policy, state: TriggerState) -> Decision:
    """The pipeline's decision: laredo's rule when changes are pending, plus an idle-table ceiling.

    With pending changes it is exactly `should_snapshot`: a snapshot with its trigger, else a diff.
    With none, laredo writes nothing at all, so a table that changed once and then went quiet
    would never be re-based and its readers would replay that tail of diffs forever; this project
    still honours `max_interval` then, but only when something changed since the last snapshot
    (`churn_records > 0`): re-snapshotting an unchanged table would copy identical bytes. The
    floor applies as always. The size and churn triggers keep laredo's meaning, a judgement on a
    diff about to be written; with no pending changes there is none to judge.
    """
    if state.changes_pending > 0:
        fired, trigger = should_snapshot(policy, state)
        return Decision("snapshot", trigger) if fired else DIFF
    idle_rebase = (state.churn_records > 0 and not _inside_floor(policy, state.since_snapshot)
                   and _past_ceiling(policy, state.since_snapshot))
    return Decision("snapshot", "max_interval") if idle_rebase else NOTHING
