"""The re-base policy: laredo's decision table verbatim, its boundaries, and the pipeline's `decide`."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from snapshot_assets.archive.policy import Decision, Policy, TriggerState, decide, should_snapshot

MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)
MIB = 1 << 20

# laredo's TestPolicy_ShouldSnapshot policy.
LAREDO = Policy(
    diff_interval=timedelta(seconds=30),
    min_interval=5 * MIN,
    max_interval=6 * HOUR,
    max_diff_bytes=1000,
    max_diff_fraction=0.25,
    max_churn_records=100,
    max_churn_fraction=0.5,
)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(TriggerState(MIN, diff_bytes=MIB, churn_records=1_000_000, dataset_size=10,
                                  last_snapshot_bytes=10), (False, ""),
                     id="within min interval never snapshots"),
        pytest.param(TriggerState(7 * HOUR, diff_bytes=1, churn_records=1), (True, "max_interval"),
                     id="max interval"),
        pytest.param(TriggerState(10 * MIN, diff_bytes=1000, churn_records=1), (True, "max_diff_bytes"),
                     id="diff bytes absolute"),
        pytest.param(TriggerState(10 * MIN, diff_bytes=300, last_snapshot_bytes=1000),
                     (True, "max_diff_fraction"), id="diff fraction of last snapshot"),
        pytest.param(TriggerState(10 * MIN, diff_bytes=10, churn_records=100), (True, "max_churn_records"),
                     id="churn records"),
        pytest.param(TriggerState(10 * MIN, diff_bytes=10, churn_records=60, dataset_size=100),
                     (True, "max_churn_fraction"), id="churn fraction of dataset"),
        pytest.param(TriggerState(10 * MIN, diff_bytes=10, churn_records=1, dataset_size=1000,
                                  last_snapshot_bytes=MIB), (False, ""), id="quiet table writes a diff"),
    ],
)
def test_laredo_table(state: TriggerState, expected: tuple[bool, str]) -> None:
    assert should_snapshot(LAREDO, state) == expected


def test_all_zero_policy_never_snapshots() -> None:
    state = TriggerState(100 * HOUR, diff_bytes=1 << 30, churn_records=1 << 30, dataset_size=1,
                         last_snapshot_bytes=1)
    assert should_snapshot(Policy(), state) == (False, "")
    assert decide(Policy(), TriggerState(100 * HOUR, churn_records=5, changes_pending=5)) == Decision("diff")
    assert decide(Policy(), TriggerState(100 * HOUR, churn_records=5)) == Decision("none")


# Each trigger alone: a state exactly at its threshold and one just below it.
T0 = timedelta(0)
ONLY = {
    "max_interval": (Policy(max_interval=HOUR), TriggerState(HOUR),
                     TriggerState(HOUR - timedelta(microseconds=1))),
    "max_diff_bytes": (Policy(max_diff_bytes=1000), TriggerState(T0, diff_bytes=1000),
                       TriggerState(T0, diff_bytes=999)),
    "max_diff_fraction": (Policy(max_diff_fraction=0.25),
                          TriggerState(T0, diff_bytes=250, last_snapshot_bytes=1000),
                          TriggerState(T0, diff_bytes=249, last_snapshot_bytes=1000)),
    "max_churn_records": (Policy(max_churn_records=100), TriggerState(T0, churn_records=100),
                          TriggerState(T0, churn_records=99)),
    "max_churn_fraction": (Policy(max_churn_fraction=0.5),
                           TriggerState(T0, churn_records=50, dataset_size=100),
                           TriggerState(T0, churn_records=49, dataset_size=100)),
}


@pytest.mark.parametrize("trigger", list(ONLY))
def test_every_comparison_is_inclusive(trigger: str) -> None:
    policy, at, below = ONLY[trigger]
    assert should_snapshot(policy, at) == (True, trigger)
    assert should_snapshot(policy, below) == (False, "")


def test_min_interval_boundary_is_exclusive_of_the_floor() -> None:
    policy = Policy(min_interval=5 * MIN, max_churn_records=1)
    just_inside = 5 * MIN - timedelta(microseconds=1)
    assert should_snapshot(policy, TriggerState(just_inside, churn_records=1)) == (False, "")
    assert should_snapshot(policy, TriggerState(5 * MIN, churn_records=1)) == (True, "max_churn_records")


def test_floor_beats_even_the_ceiling() -> None:
    policy = Policy(min_interval=2 * HOUR, max_interval=HOUR)
    assert should_snapshot(policy, TriggerState(90 * MIN)) == (False, "")
    assert should_snapshot(policy, TriggerState(2 * HOUR)) == (True, "max_interval")


def test_fractions_need_a_nonzero_denominator() -> None:
    no_snapshot_yet = TriggerState(HOUR, diff_bytes=MIB, last_snapshot_bytes=0)
    empty_table = TriggerState(HOUR, churn_records=MIB, dataset_size=0)
    assert should_snapshot(Policy(max_diff_fraction=0.25), no_snapshot_yet) == (False, "")
    assert should_snapshot(Policy(max_churn_fraction=0.5), empty_table) == (False, "")


def test_fraction_is_float64_arithmetic() -> None:
    # 0.07 * 100 is 7.000000000000001 in float64: 7 churned rows of 100 is *below* 7% in Go, and here.
    at_seven_percent = TriggerState(HOUR, churn_records=7, dataset_size=100)
    assert should_snapshot(Policy(max_churn_fraction=0.07), at_seven_percent) == (False, "")
    assert should_snapshot(Policy(max_churn_fraction=0.07), TriggerState(HOUR, churn_records=8,
                                                                          dataset_size=100))[0]


ALL_FIRE = TriggerState(7 * HOUR, diff_bytes=MIB, churn_records=1_000_000, dataset_size=10,
                        last_snapshot_bytes=10)


@pytest.mark.parametrize(
    ("disabled", "expected"),
    [
        ((), "max_interval"),
        (("max_interval",), "max_diff_bytes"),
        (("max_interval", "max_diff_bytes"), "max_diff_fraction"),
        (("max_interval", "max_diff_bytes", "max_diff_fraction"), "max_churn_records"),
        (("max_interval", "max_diff_bytes", "max_diff_fraction", "max_churn_records"), "max_churn_fraction"),
    ],
)
def test_precedence_when_several_fire(disabled: tuple[str, ...], expected: str) -> None:
    off: dict[str, Any] = {"max_interval": timedelta(0), "max_diff_bytes": 0, "max_diff_fraction": 0.0,
                           "max_churn_records": 0}
    policy = dataclasses.replace(LAREDO, **{name: off[name] for name in disabled})
    assert should_snapshot(policy, ALL_FIRE) == (True, expected)


# decide(): the pipeline layer.

def test_decide_with_pending_changes_is_should_snapshot() -> None:
    quiet = TriggerState(10 * MIN, diff_bytes=10, churn_records=1, changes_pending=1)
    big = dataclasses.replace(quiet, diff_bytes=1000)
    inside_floor = TriggerState(MIN, diff_bytes=MIB, churn_records=10**6, changes_pending=1)
    assert decide(LAREDO, quiet) == Decision("diff")
    assert decide(LAREDO, big) == Decision("snapshot", "max_diff_bytes")
    assert decide(LAREDO, inside_floor) == Decision("diff")


def test_decide_nothing_pending_nothing_changed_is_none() -> None:
    assert decide(LAREDO, TriggerState(100 * HOUR)) == Decision("none")


def test_decide_idle_table_past_max_interval_rebases() -> None:
    idle = TriggerState(7 * HOUR, churn_records=3, changes_pending=0)
    assert decide(LAREDO, idle) == Decision("snapshot", "max_interval")
    assert decide(LAREDO, TriggerState(6 * HOUR, churn_records=3)) == Decision("snapshot", "max_interval")


def test_decide_idle_table_before_max_interval_is_none() -> None:
    # Only the ceiling fires on an idle table: the churn and size triggers judge a pending diff.
    assert decide(LAREDO, TriggerState(5 * HOUR, churn_records=10**6, dataset_size=1)) == Decision("none")


def test_decide_idle_table_without_ceiling_or_inside_floor_is_none() -> None:
    assert decide(Policy(max_churn_records=1), TriggerState(100 * HOUR, churn_records=3)) == Decision("none")
    floor_above_ceiling = Policy(min_interval=8 * HOUR, max_interval=6 * HOUR)
    assert decide(floor_above_ceiling, TriggerState(7 * HOUR, churn_records=3)) == Decision("none")
    assert decide(floor_above_ceiling, TriggerState(8 * HOUR, churn_records=3)) == Decision(
        "snapshot", "max_interval")
