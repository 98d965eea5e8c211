"""The outbox retry sensor, with `build_sensor_context`: a failed sink is retried, the others are not held up.

Each table has a real file sink; `public.users`'s cannot be written at first (a directory stands
where its file must be), `public.orders`'s can. Events are enqueued in the real outbox the way a
commit enqueues them.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from sensors.outbox_retry import outbox_retry
from snapshot_assets.config import SnapshotterConfig
from snapshot_assets.tables import pipeline
from tests.sensors.conftest import ORDERS, USERS, poll


def tick(instance: dg.DagsterInstance) -> str:
    result = outbox_retry(dg.build_sensor_context(instance=instance))
    assert isinstance(result, dg.SkipReason) and result.skip_message is not None
    return result.skip_message


def event(table: str) -> dict[str, object]:
    return {"id": f"{table}:snapshot:0/1", "table": table, "kind": "snapshot", "to_position": "0/1"}


def delivered(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.slow  # waits out the outbox's real 2 s backoff
def test_a_failed_sink_is_retried_and_the_other_tables_are_delivered(sink_config: SnapshotterConfig,
                                                                     instance: dg.DagsterInstance) -> None:
    sinks = {t: Path(sink_config.table(t).events[0]["path"]) for t in (USERS, ORDERS)}
    sinks[USERS].mkdir(parents=True)  # the sink's file cannot be opened for appending
    for table in (USERS, ORDERS):
        pipe = pipeline(table)
        pipe.outbox.enqueue(event(table), pipe.sinks)

    assert tick(instance) == "delivered 1, failed 1, still pending 1"
    assert delivered(sinks[ORDERS]) == [event(ORDERS)]
    assert tick(instance) == "delivered 0, failed 0, still pending 1", "inside its backoff the event is not retried"

    sinks[USERS].rmdir()
    poll(lambda: tick(instance) == "delivered 1, failed 0, still pending 0" or None, 10, "the retried delivery")
    assert delivered(sinks[USERS]) == [event(USERS)]
    assert delivered(sinks[ORDERS]) == [event(ORDERS)], "delivered once"
    assert tick(instance) == "delivered 0, failed 0, still pending 0"
