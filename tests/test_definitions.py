"""The Dagster code location loads, registers the resources its assets and jobs use, and its archive
job verifies a real archive (the resources at work in runs: tests/aws/test_dagster_resources.py)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource

from snapshot_assets.archive_jobs import verify_archive_job
from snapshot_assets.definitions import defs

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample-archive"


def _config(path: Path) -> dict[str, object]:
    return {"ops": {"verify_archive_op": {"config": {
        "path": str(path), "key_prefix": "users/", "deep": True}}}}


def test_definitions_load() -> None:
    repo = defs.get_repository_def()
    assert "verify_archive_job" in {j.name for j in repo.get_all_jobs()}


def test_workspace_loads_the_code_location() -> None:
    text = (SAMPLE.parents[1] / "workspace.yaml").read_text()
    assert "snapshot_assets.definitions" in text


def test_verify_job_passes_on_sample() -> None:
    result = verify_archive_job.execute_in_process(run_config=_config(SAMPLE), instance=dg.DagsterInstance.ephemeral())
    assert result.success
    assert result.output_for_node("verify_archive_op") == 5


def test_verify_job_fails_on_damaged_archive(tmp_path: Path) -> None:
    copy = tmp_path / "a"
    shutil.copytree(SAMPLE, copy)
    (copy / "users/epoch=1/snapshot-0_016B3748.pb").unlink()
    result = verify_archive_job.execute_in_process(run_config=_config(copy), raise_on_error=False,
                                                   instance=dg.DagsterInstance.ephemeral())
    assert not result.success
    failure = result.failure_data_for_node("verify_archive_op")
    assert failure is not None and "problem" in str(failure.error)


def test_definitions_register_the_resources_the_assets_and_jobs_use() -> None:
    registered: Mapping[str, Any] = defs.resources or {}
    assert isinstance(registered["spark"], PySparkResource)
    assert {"spark", "s3", "destinations", "event_sinks", "subscribers", "change_buffers",
            "artifact_io_manager"} <= set(registered)
    repo = defs.get_repository_def()
    needs = {key: set(repo.assets_defs_by_key[dg.AssetKey(key)].required_resource_keys)
             for key in ("snapshot", "diff", "manifest")}
    assert {"spark", "destinations", "event_sinks", "artifact_io_manager"} <= needs["snapshot"] & needs["diff"]
    assert {"destinations", "event_sinks"} <= needs["manifest"]
    ingest = repo.get_job("ingest_job")
    assert {"subscribers", "change_buffers"} <= ingest.get_required_resource_defs().keys()
    assert issubclass(registered["s3"].resource_cls, S3Resource)  # configured at launch: a PartialResource
