"""The capture pages asset, its check and the reconciliation job, run by Dagster over pages a real
capture server wrote (local destination, SQLite index)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dagster as dg

from resources.capture.index import SqlIndex
from resources.capture.settings import CaptureSettings
from snapshot_assets.capture.assets import capture_index_matches_storage, capture_pages
from snapshot_assets.capture.jobs import capture_reconcile_job
from snapshot_assets.capture.observe import capture_pages_observer
from snapshot_assets.capture.resource import CaptureResource
from snapshot_assets.config import load_config
from snapshot_assets.definitions import defs
from tests.capture.conftest import Running

Serve = Callable[[CaptureSettings], Running]

CONFIG = """snapshotter { capture {
  buffer { path = "%(root)s/buffer", max_events = 3 }
  storage { destination { type = local, path = "%(root)s/pages" }, key_template = "p/{date}/{writer_id}/{sequence}" }
  index { backend = sqlite, dsn = "%(root)s/index.db" }
} }
"""


def test_pages_asset_check_and_reconciliation(tmp_path: Path, serve: Serve) -> None:
    config = tmp_path / "capture.conf"
    config.write_text(CONFIG % {"root": tmp_path})
    settings = load_config(config).capture
    assert settings is not None
    running = serve(settings)
    for i in range(7):
        running.publish("w1" if i % 2 else "w2", bytes(100))
    running.stop()
    day = next(iter(SqlIndex(settings.index).pages("w1", None, None)))["page_key"].split("/")[1]
    resource = CaptureResource(config_file=str(config))
    instance = dg.DagsterInstance.ephemeral()

    result = dg.materialize([capture_pages, capture_index_matches_storage], partition_key=day,
                            resources={"capture": resource}, instance=instance)
    assert result.success
    [mat] = result.asset_materializations_for_node("capture_pages")
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert (meta["pages"], meta["events"], meta["writers"], meta["page_bytes"] > 700) \
        == (3, 7, 2, True)  # w1: 3; w2: 3, 1
    [check] = result.get_asset_check_evaluations()
    assert check.passed

    sql = SqlIndex(settings.index)
    sql.delete(sql.pages("w2", None, None)[0]["page_key"])
    result = dg.materialize([capture_pages, capture_index_matches_storage], partition_key=day,
                            resources={"capture": resource}, instance=instance)
    [check] = result.get_asset_check_evaluations()
    assert not check.passed and check.metadata["unindexed"].value == {"ObjectIndex": 0, "SqlIndex": 1}

    job = capture_reconcile_job.execute_in_process(resources={"capture": resource}, instance=instance)
    assert job.output_for_node("reconcile_capture_index") == 1
    result = dg.materialize([capture_pages, capture_index_matches_storage], partition_key=day,
                            resources={"capture": resource}, instance=instance)
    assert result.get_asset_check_evaluations()[0].passed


def test_observer_reports_a_day_when_its_pages_change(tmp_path: Path, serve: Serve) -> None:
    config = tmp_path / "capture.conf"
    config.write_text(CONFIG % {"root": tmp_path})
    settings = load_config(config).capture
    assert settings is not None
    resource = CaptureResource(config_file=str(config))
    instance = dg.DagsterInstance.ephemeral()
    quiet = capture_pages_observer(dg.build_sensor_context(instance=instance, resources={"capture": resource}))
    assert isinstance(quiet, dg.SensorResult) and quiet.skip_reason is not None

    running = serve(settings)
    for i in range(3):
        running.publish("obs", bytes([i]) * 10)
    running.stop()
    context = dg.build_sensor_context(instance=instance, cursor=quiet.cursor, resources={"capture": resource})
    result = capture_pages_observer(context)
    assert isinstance(result, dg.SensorResult) and result.asset_events
    [observation] = result.asset_events
    assert isinstance(observation, dg.AssetObservation)
    assert (observation.metadata["pages"].value, observation.metadata["events"].value) == (1, 3)
    again = capture_pages_observer(dg.build_sensor_context(instance=instance, cursor=result.cursor,
                                                           resources={"capture": resource}))
    assert isinstance(again, dg.SensorResult) and not again.asset_events  # nothing new: no second observation


def test_registered_in_the_code_location() -> None:
    repo = defs.get_repository_def()
    assert "capture_reconcile_job" in {j.name for j in repo.get_all_jobs()}
    assert dg.AssetKey("capture_pages") in {a.key for a in repo.asset_graph.asset_nodes}
