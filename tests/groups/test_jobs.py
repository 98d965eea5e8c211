"""The group's Dagster jobs on the code location's resources: a cut run (real Spark builds, the
members' manifests and the group manifest on a local destination), and the Spark reconstruct of
the group at a cut. The buffers are written as a PostgreSQL source writes them (tests/groups/support.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from resources.spark import SparkResource
from resources.subscribers.events import ChangeEvent, TxEnd
from snapshot_assets.archive.changes import Action
from snapshot_assets.config import SnapshotterConfig
from snapshot_assets.definitions import resources
from snapshot_assets.groups.cut import GroupPipeline
from snapshot_assets.groups.jobs import group_cut_job, reconstruct_group_job
from snapshot_assets.spark.session import LOCAL_DEFAULTS
from tests.groups.support import ACCOUNTS, TRANSFERS, feed, initial_copy

pytestmark = pytest.mark.slow


def defs() -> dg.Definitions:
    spark = SparkResource(spark_config={**LOCAL_DEFAULTS, "spark.master": "local[2]",
                                        "spark.sql.shuffle.partitions": "3", "spark.ui.showConsoleProgress": "false"})
    return dg.Definitions(jobs=[group_cut_job, reconstruct_group_job], resources={**resources(), "spark": spark})


def run(job: str, instance: dg.DagsterInstance, **config: Any) -> dg.ExecuteInProcessResult:
    op = "cut_group" if job == group_cut_job.name else "reconstruct_group"
    result = defs().resolve_job_def(job).execute_in_process(instance=instance, raise_on_error=False,
                                                            run_config={"ops": {op: {"config": config}}})
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    return result


def rows(folder: Path) -> set[tuple[int, int]]:
    lines = [line for part in sorted(folder.glob("part-*")) for line in part.read_text().splitlines() if line]
    return {(int(r["id"]), int(r["v"])) for r in map(json.loads, lines)}


def test_cut_runs_and_the_spark_reconstruct_of_a_cut(group_config: SnapshotterConfig, instance: dg.DagsterInstance,
                                                    tmp_path: Path) -> None:
    feed(group_config, ACCOUNTS, *initial_copy(ACCOUNTS, "0/100"), TxEnd("0/2FF"))
    feed(group_config, TRANSFERS, *initial_copy(TRANSFERS, "0/200"), TxEnd("0/280"))
    first = run(group_cut_job.name, instance, group="ledger")
    assert first.output_for_node("cut_group") == "0/280"  # both first snapshots at the common position
    made = {(m.asset_key.path[-1], m.partition, m.metadata["to_position"].value)
            for m in first.asset_materializations_for_node("cut_group")}
    assert made == {("snapshot", ACCOUNTS, "0/280"), ("snapshot", TRANSFERS, "0/280")}

    feed(group_config, ACCOUNTS, ChangeEvent("0/300", Action.INSERT, new={"id": 2, "v": 20}), TxEnd("0/300"))
    feed(group_config, TRANSFERS, TxEnd("0/310"))  # idle: complete through 0/310
    second = run(group_cut_job.name, instance, group="ledger")
    assert second.output_for_node("cut_group") == "0/300"
    group = GroupPipeline.of(group_config, "ledger")
    (cut1, cut2) = group.manifest().cuts
    assert {t: m.to_position for t, m in cut2.tables.items()} == {ACCOUNTS: "0/300", TRANSFERS: "0/280"}
    assert [a.kind for a in group.members[0].manifest().artifacts] == ["snapshot", "diff"]
    assert [a.kind for a in group.members[1].manifest().artifacts] == ["snapshot"]  # nothing to write

    assert run(group_cut_job.name, instance, group="ledger").output_for_node("cut_group") == ""  # nothing new

    out = tmp_path / "at"
    done = run(reconstruct_group_job.name, instance, group="ledger", position="0/2FF", output_path=str(out),
               format="jsonl")
    assert done.output_for_node("reconstruct_group") == cut1.position
    assert rows(out / ACCOUNTS) == {(1, 10)} and rows(out / TRANSFERS) == {(1, 10)}
    head = tmp_path / "head"
    run(reconstruct_group_job.name, instance, group="ledger", output_path=str(head), format="jsonl")
    assert rows(head / ACCOUNTS) == {(1, 10), (2, 20)} and rows(head / TRANSFERS) == {(1, 10)}
