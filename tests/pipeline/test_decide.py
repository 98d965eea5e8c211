"""The trigger decision from manifest + buffer statistics."""

from __future__ import annotations

import datetime as dt

from resources.buffer import BufferStats
from snapshot_assets.archive.manifest import Artifact, FormatRef, Manifest, loads
from snapshot_assets.archive.policy import Policy
from snapshot_assets.archive.positions import compare_lsn
from snapshot_assets.pipeline.decide import FORCED, NextArtifact, next_artifact, still_due

NOW = dt.datetime(2026, 6, 3, 22, 0, tzinfo=dt.UTC)
REF = {"jsonl": FormatRef("u", 1000)}


def stats(durable: str | None, changes: int = 0, nbytes: int = 0, resync: bool = False) -> BufferStats:
    return BufferStats(since_position=None, durable_position=durable, low_water=None, segments=1, changes=changes,
                       bytes=nbytes, distinct_keys_estimate=changes, resync_pending=resync, first_position=None,
                       last_position=durable, oldest_change_age_s=None, last_seal_latency_s=None,
                       avg_seal_latency_s=None, seals=1)


def manifest(snap_age: dt.timedelta, diffs: int = 0) -> Manifest:
    created = (NOW - snap_age).strftime("%Y-%m-%dT%H:%M:%SZ")
    m = Manifest(table="public.t").with_artifact(
        Artifact("snapshot", 1, None, "0/10", created, REF, row_count=100), now=created)
    pos = 0x10
    for _ in range(diffs):
        m = m.with_artifact(Artifact("diff", 1, f"0/{pos:X}", f"0/{pos + 0x10:X}", created, REF, change_count=10))
        pos += 0x10
    return m


POLICY = Policy(diff_interval=dt.timedelta(seconds=30), min_interval=dt.timedelta(minutes=5),
                max_interval=dt.timedelta(hours=6), max_churn_records=50)


def test_nothing_ingested_and_initial_snapshot() -> None:
    assert next_artifact(Manifest(table="t"), stats(None), POLICY, NOW).kind == "none"
    n = next_artifact(Manifest(table="t"), stats("0/5"), POLICY, NOW)
    assert (n.kind, n.trigger, n.to_position) == ("snapshot", "initial", "0/5")


def test_pending_changes_make_a_diff_with_a_boundary_run_key() -> None:
    n = next_artifact(manifest(dt.timedelta(minutes=1)), stats("0/20", changes=3), POLICY, NOW)
    assert (n.kind, n.from_position, n.to_position) == ("diff", "0/10", "0/20")
    assert n.run_key == "diff:0/10:0/20"


def test_churn_triggers_rebase_outside_the_floor() -> None:
    m = manifest(dt.timedelta(minutes=10), diffs=4)  # 40 committed + 10 pending >= 50
    n = next_artifact(m, stats("0/60", changes=10), POLICY, NOW)
    assert (n.kind, n.trigger) == ("snapshot", "max_churn_records")
    inside_floor = manifest(dt.timedelta(minutes=1), diffs=4)
    assert next_artifact(inside_floor, stats("0/60", changes=10), POLICY, NOW).kind == "diff"


def test_idle_table_rebases_after_max_interval_only_if_it_changed() -> None:
    m = manifest(dt.timedelta(hours=7), diffs=1)
    n = next_artifact(m, stats("0/20"), POLICY, NOW)  # nothing pending, head == durable
    assert (n.kind, n.trigger, n.to_position) == ("snapshot", "max_interval", "0/20")
    assert next_artifact(manifest(dt.timedelta(hours=7)), stats("0/10"), POLICY, NOW).kind == "none"


def test_resync_and_force() -> None:
    m = manifest(dt.timedelta(minutes=1))
    assert next_artifact(m, stats("0/20", changes=1, resync=True), POLICY, NOW).trigger == "resync"
    forced = next_artifact(m, stats("0/10"), POLICY, NOW, force=True)
    assert (forced.kind, forced.trigger, forced.to_position) == ("snapshot", "forced", "0/10")


SIZE_POLICY = Policy(diff_interval=dt.timedelta(seconds=30), min_interval=dt.timedelta(minutes=5),
                     max_interval=dt.timedelta(hours=6), max_diff_fraction=0.5)


class Measure:
    """A DiffSize that answers `size` and records what it was asked."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.asked: list[tuple[str, str]] = []

    def __call__(self, from_position: str, to_position: str) -> int:
        self.asked.append((from_position, to_position))
        return self.size


def test_size_triggers_judge_the_measured_diff_not_the_buffer_bytes() -> None:
    m = manifest(dt.timedelta(minutes=10))  # last snapshot: 1000 bytes (its primary format)
    big = Measure(500)  # 0.5 x 1000: fires, although the buffer holds only 10 bytes
    n = next_artifact(m, stats("0/20", changes=3, nbytes=10), SIZE_POLICY, NOW, diff_size=big)
    assert (n.kind, n.trigger) == ("snapshot", "max_diff_fraction")
    assert big.asked == [("0/10", "0/20")]
    small = Measure(499)  # does not fire, although the buffer holds 10,000 bytes
    n = next_artifact(m, stats("0/20", changes=3, nbytes=10_000), SIZE_POLICY, NOW, diff_size=small)
    assert (n.kind, n.trigger) == ("diff", "diff_interval")
    absolute = Policy(max_diff_bytes=4096)
    n = next_artifact(m, stats("0/20", changes=3), absolute, NOW, diff_size=Measure(4096))
    assert (n.kind, n.trigger) == ("snapshot", "max_diff_bytes")


def test_the_diff_is_measured_only_when_its_size_can_change_the_decision() -> None:
    never = Measure(10**9)
    cases = [
        (manifest(dt.timedelta(minutes=1)), stats("0/20", changes=3), SIZE_POLICY),  # inside the floor
        (manifest(dt.timedelta(hours=7)), stats("0/20", changes=3), SIZE_POLICY),  # max_interval fires first
        (manifest(dt.timedelta(minutes=10)), stats("0/10"), SIZE_POLICY),  # nothing pending
        (manifest(dt.timedelta(minutes=10)), stats("0/20", changes=3), POLICY),  # no size trigger configured
    ]
    for m, pending, policy in cases:
        next_artifact(m, pending, policy, NOW, diff_size=never)
    assert never.asked == []


def test_the_last_snapshot_size_is_that_of_its_primary_format() -> None:
    refs = {"jsonl": FormatRef("j", 1000), "protobuf": FormatRef("p", 4000)}
    created = (NOW - dt.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    m = Manifest(table="public.t").with_artifact(
        Artifact("snapshot", 1, None, "0/10", created, refs, row_count=100), now=created)
    m = loads(m.dumps())  # as read back from a destination (formats in name order)
    pending = stats("0/20", changes=3)
    n = next_artifact(m, pending, SIZE_POLICY, NOW, diff_size=Measure(1999), snapshot_format="protobuf")
    assert n.kind == "diff"  # 1999 < 0.5 x 4000 (protobuf), though it is more than 0.5 x 1000 (jsonl)
    n = next_artifact(m, pending, SIZE_POLICY, NOW, diff_size=Measure(2000), snapshot_format="protobuf")
    assert (n.kind, n.trigger) == ("snapshot", "max_diff_fraction")
    n = next_artifact(m, pending, SIZE_POLICY, NOW, diff_size=Measure(500))  # unnamed: the smallest format
    assert (n.kind, n.trigger) == ("snapshot", "max_diff_fraction")


def test_a_requested_diff_starts_at_the_head_it_finds_or_is_not_built() -> None:
    """A forced snapshot that ran while the sensor's diff waited in the queue moved the head."""
    requested = NextArtifact("diff", "diff_interval", "0/10", "0/40")
    assert still_due(requested, manifest(dt.timedelta(minutes=1)), compare_lsn) == requested
    moved = manifest(dt.timedelta(minutes=1), diffs=1)  # head 0/20, inside the requested range
    assert still_due(requested, moved, compare_lsn) == NextArtifact("diff", "diff_interval", "0/20", "0/40")
    rebased = moved.with_artifact(Artifact("snapshot", 2, None, "0/30", "2026-06-03T21:59:00Z", REF))
    assert still_due(requested, rebased, compare_lsn) == NextArtifact("diff", "diff_interval", "0/30", "0/40")
    covered = manifest(dt.timedelta(minutes=1), diffs=3)  # head 0/40: exactly the requested end
    assert still_due(requested, covered, compare_lsn) is None
    assert still_due(requested, manifest(dt.timedelta(minutes=1), diffs=4), compare_lsn) is None


def test_a_requested_snapshot_is_superseded_only_by_a_snapshot_at_or_after_its_end() -> None:
    rebase = NextArtifact("snapshot", "max_churn_records", None, "0/30")
    chain = manifest(dt.timedelta(minutes=10), diffs=2)  # head 0/30 is a diff: collapsing it is the point
    assert still_due(rebase, chain, compare_lsn) == rebase
    behind = manifest(dt.timedelta(minutes=10), diffs=1)
    assert still_due(rebase, behind, compare_lsn) == rebase
    snapped = chain.with_artifact(Artifact("snapshot", 2, None, "0/30", "2026-06-03T21:59:00Z", REF))
    assert still_due(rebase, snapped, compare_lsn) is None
    assert still_due(NextArtifact("snapshot", FORCED, None, "0/30"), snapped, compare_lsn) is not None
    assert still_due(rebase, manifest(dt.timedelta(minutes=10), diffs=3), compare_lsn) is None  # head 0/40
    assert still_due(NextArtifact("snapshot", FORCED, None, "0/30"), manifest(dt.timedelta(minutes=10), diffs=3),
                     compare_lsn) is None  # never behind the head
    first = NextArtifact("snapshot", "initial", None, "0/10")
    assert still_due(first, Manifest(table="public.t"), compare_lsn) == first
