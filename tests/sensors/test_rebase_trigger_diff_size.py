"""The re-base trigger's measurement of the pending diff when Spark does not answer.

A Spark Connect client retries an endpoint that does not answer for about ten minutes; a sensor
tick must not wait for it (Dagster would time the tick out, and every table would go without a
decision), nor keep its process alive that long. The endpoint here is a real closed port on
loopback, the table a real ingested buffer.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from snapshot_assets.config import SnapshotterConfig, SparkConfig
from snapshot_assets.pipeline.diff_size import MeasuringSpark, diff_size
from snapshot_assets.tables import pipeline
from tests.sensors.conftest import USERS, ingest
from tests.spark.conftest import assert_no_connect_session_left, closed_endpoint, connect_sessions

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")

STAND_IN = (f"{USERS}: cannot measure the pending diff with Spark ({{error}}); the size triggers judge the "
            "buffer's 1234 bytes since the head instead")


def unanswering() -> SparkConfig:
    return SparkConfig(remote=closed_endpoint())


def test_an_unanswering_spark_fails_the_measurement_in_seconds_and_the_buffer_bytes_stand_in(
        sensor_config: SnapshotterConfig, caplog: pytest.LogCaptureFixture) -> None:
    durable = ingest(sensor_config, USERS)
    spark = MeasuringSpark(unanswering(), budget_s=60.0)
    size = diff_size(pipeline(USERS), spark, 1234, logging.getLogger("rebase-trigger-test"))
    try:
        with caplog.at_level(logging.WARNING):
            started = time.monotonic()
            assert size("", durable) == 1234
            assert time.monotonic() - started < 30.0
    finally:
        spark.close()
    assert "cannot measure the pending diff with Spark (" in caplog.text
    assert "TimeoutError" not in caplog.text, "the client gave up by itself, within the budget"


def test_a_spent_budget_answers_at_once_with_the_buffer_bytes(
        sensor_config: SnapshotterConfig, caplog: pytest.LogCaptureFixture) -> None:
    durable = ingest(sensor_config, USERS)
    before = connect_sessions()
    spark = MeasuringSpark(unanswering(), budget_s=0.0)
    size = diff_size(pipeline(USERS), spark, 1234, logging.getLogger("rebase-trigger-test"))
    try:
        with caplog.at_level(logging.WARNING):
            started = time.monotonic()
            assert size("", durable) == 1234
            assert size("", durable) == 1234
            assert time.monotonic() - started < 1.0
    finally:
        spark.close()
    error = "TimeoutError: no measurement within the tick's budget of 0s"
    assert caplog.text.count(STAND_IN.format(error=error)) == 2
    # The measurement left behind ends by itself (bounded retries) and takes its session with it.
    for worker in [t for t in threading.enumerate() if t.name.startswith("measure-")]:
        worker.join(60)
        assert not worker.is_alive()
    assert_no_connect_session_left(before)
