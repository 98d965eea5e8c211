"""The re-base trigger's measurement of the pending diff when Spark does not answer.

A Spark Connect client retries an endpoint that does not answer for minutes; a sensor tick must
not wait for it (Dagster would time the tick out, and every table would go without a decision).
The endpoint here is a real closed port on loopback, the table a real ingested buffer.
"""

from __future__ import annotations

import logging
import socket
import time

import pytest

from sensors.rebase_trigger import MeasuringSpark, diff_size
from snapshot_assets.config import SnapshotterConfig, SparkConfig
from snapshot_assets.tables import pipeline
from tests.sensors.conftest import USERS, ingest

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unanswering_spark_costs_one_budget_per_tick_and_the_buffer_bytes_stand_in(
        sensor_config: SnapshotterConfig, caplog: pytest.LogCaptureFixture) -> None:
    durable = ingest(sensor_config, USERS)
    spark = MeasuringSpark(SparkConfig(remote=f"sc://127.0.0.1:{closed_port()}"), budget_s=3.0)
    size = diff_size(pipeline(USERS), spark, 1234, logging.getLogger("rebase-trigger-test"))
    try:
        with caplog.at_level(logging.WARNING):
            started = time.monotonic()
            assert size("", durable) == 1234
            waited = time.monotonic() - started
            assert 2.5 <= waited < 10.0, waited
            started = time.monotonic()
            assert size("", durable) == 1234  # the tick does not wait a second time
            assert time.monotonic() - started < 1.0
    finally:
        spark.close()
    assert caplog.text.count(f"{USERS}: cannot measure the pending diff with Spark (TimeoutError: no measurement "
                             "within the tick's budget of 3s); the size triggers judge the buffer's 1234 bytes "
                             "since the head instead") == 2
