"""The ingest's final request on shutdown, per table, against a real instance and the code location.

Runs are submitted for real (launch.Launcher: the repository's workspace file, the code location
loaded in process) to an instance whose run coordinator queues them, as the daemon's would; no
daemon runs them here (the end-to-end tests in tests/e2e do). Checked: a table with nothing
archived yet gets the initial snapshot its policy requires, not a diff, tagged like the trigger
sensor's run of that boundary; a table with a run already queued gets none (one writer per table);
a table whose buffer ends at its manifest head gets none.
"""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest

from snapshot_assets.config import SnapshotterConfig
from snapshot_assets.launch import Launcher, workspace_origin
from snapshot_assets.shutdown import request_final_artifacts
from snapshot_assets.tables import (
    ATTEMPT_TAG,
    BOUNDARY_TAG,
    FROM_TAG,
    PARTITION_TAG,
    TABLE_TAG,
    TO_TAG,
    TRIGGER_TAG,
    pipeline,
)
from tests.aws.support import snapshot
from tests.dagster_instances import checked_instance
from tests.e2e.conftest import REPO
from tests.sensors.conftest import ORDERS, USERS, ingest

pytestmark = pytest.mark.slow  # the code location is loaded in process (seconds on a loaded machine)


@pytest.fixture
def queued_instance() -> Iterator[dg.DagsterInstance]:
    """A test instance with the run queue of the repository's dagster.yaml (submitting only enqueues)."""
    coordinator = {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}
    with checked_instance(overrides={"run_coordinator": coordinator}) as instance:
        yield instance


def test_final_requests_per_table(sensor_config: SnapshotterConfig, queued_instance: dg.DagsterInstance) -> None:
    users_at, orders_at = ingest(sensor_config, USERS), ingest(sensor_config, ORDERS)
    orders = pipeline(ORDERS)
    orders.commit(snapshot(orders, orders_at))
    with Launcher(queued_instance, workspace_origin(REPO / "workspace.yaml")) as launcher:
        first = request_final_artifacts([pipeline(USERS), orders], queued_instance, launcher.submit)
        again = request_final_artifacts([pipeline(USERS)], queued_instance, launcher.submit)

    users, quiet = first
    assert users.run_id is not None and quiet.run_id is None
    assert quiet.detail == "nothing buffered after the manifest head"
    run = queued_instance.get_run_by_id(users.run_id)
    assert run is not None and run.job_name == "snapshot_job" and run.status == dg.DagsterRunStatus.QUEUED
    assert {k: run.tags[k] for k in (PARTITION_TAG, TABLE_TAG, TRIGGER_TAG, FROM_TAG, TO_TAG, BOUNDARY_TAG,
                                     ATTEMPT_TAG)} == {
        PARTITION_TAG: USERS, TABLE_TAG: USERS, TRIGGER_TAG: "initial", FROM_TAG: "", TO_TAG: users_at,
        BOUNDARY_TAG: f"{USERS}:snapshot:-:{users_at}", ATTEMPT_TAG: "0"}
    assert run.remote_job_origin is not None and run.remote_job_origin.location_name == "snapshotter"
    assert users.detail == f"final snapshot at {users_at} (initial) requested: run {users.run_id}"

    (busy,) = again
    assert busy.run_id is None
    assert busy.detail == f"run {users.run_id} (snapshot_job) is QUEUED: the trigger sensor follows up after it"
