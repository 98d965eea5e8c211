"""Event sinks (one conformance suite on moto_server for SNS/SQS/Kinesis, plus the file sink) and the outbox."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import boto3
import pytest

from resources.sinks.base import EventSink, SinkError
from resources.sinks.factory import build_sink
from resources.work_storage import WorkRoot
from snapshot_assets.archive.manifest import Artifact, FormatRef
from snapshot_assets.pipeline.outbox import Outbox, artifact_event

ART = Artifact("diff", 3, "0/10", "0/20", "2026-06-03T21:40:00Z", {"jsonl": FormatRef("s3://b/t/x.jsonl", 9)},
               change_count=2)
EVENT = artifact_event("public.users", ART, "0/20", "s3://b/t/manifest.json")

Received = Callable[[], list[Mapping[str, Any]]]


def _client(endpoint: str, service: str) -> Any:
    make: Callable[..., Any] = boto3.client
    return make(service, endpoint_url=endpoint, region_name="us-east-1")


def _sqs_reader(sqs: Any, url: str) -> Received:
    def read() -> list[Mapping[str, Any]]:
        out = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
        return [m for m in out.get("Messages", [])]
    return read


def make_sqs(endpoint: str, tmp_path: Path, fifo: bool = False) -> tuple[EventSink, Received]:
    sqs = _client(endpoint, "sqs")
    name = f"q-{uuid.uuid4().hex[:8]}" + (".fifo" if fifo else "")
    attrs = {"FifoQueue": "true"} if fifo else {}
    url = sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]
    sink = build_sink({"type": "sqs", "queue_url": url, "endpoint_url": endpoint, "region": "us-east-1"})
    read = _sqs_reader(sqs, url)
    return sink, lambda: [json.loads(m["Body"]) for m in read()]


def make_sns(endpoint: str, tmp_path: Path) -> tuple[EventSink, Received]:
    sns, sqs = _client(endpoint, "sns"), _client(endpoint, "sqs")
    topic = sns.create_topic(Name=f"t-{uuid.uuid4().hex[:8]}")["TopicArn"]
    url = sqs.create_queue(QueueName=f"sub-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    sink = build_sink({"type": "sns", "topic_arn": topic, "endpoint_url": endpoint, "region": "us-east-1"})
    read = _sqs_reader(sqs, url)
    return sink, lambda: [json.loads(m["Body"]) for m in read()]


def make_kinesis(endpoint: str, tmp_path: Path) -> tuple[EventSink, Received]:
    kin = _client(endpoint, "kinesis")
    name = f"s-{uuid.uuid4().hex[:8]}"
    kin.create_stream(StreamName=name, ShardCount=1)
    sink = build_sink({"type": "kinesis", "stream": name, "endpoint_url": endpoint, "region": "us-east-1"})

    def read() -> list[Mapping[str, Any]]:
        shard = kin.describe_stream(StreamName=name)["StreamDescription"]["Shards"][0]["ShardId"]
        it = kin.get_shard_iterator(StreamName=name, ShardId=shard, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        records = kin.get_records(ShardIterator=it)["Records"]
        assert all(r["PartitionKey"] == "public.users" for r in records)
        return [json.loads(r["Data"]) for r in records]
    return sink, read


def make_file(endpoint: str, tmp_path: Path) -> tuple[EventSink, Received]:
    path = tmp_path / "events.jsonl"
    sink = build_sink({"type": "file", "path": str(path)})
    return sink, lambda: [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("make", [make_file, make_sqs, make_sns, make_kinesis], ids=["file", "sqs", "sns", "kinesis"])
def test_sink_delivers_the_spec_event(make: Any, moto_server: str, tmp_path: Path) -> None:
    sink, received = make(moto_server, tmp_path)
    sink.publish(EVENT)
    (got,) = received()
    assert got == EVENT
    assert got["manifest_uri"] == "s3://b/t/manifest.json" and got["id"] == "public.users:diff:0/20"
    assert set(got) >= {"table", "kind", "epoch", "from_position", "to_position", "head_position", "manifest_uri",
                        "formats", "created_at"}


def test_fifo_queue_gets_group_and_dedup(moto_server: str, tmp_path: Path) -> None:
    sink, received = make_sqs(moto_server, tmp_path, fifo=True)
    sink.publish(EVENT)
    sink.publish(EVENT)  # a redelivery: FIFO deduplication drops it
    assert received() == [EVENT]


@pytest.mark.parametrize("spec", [
    {"type": "sqs", "queue_url": "http://127.0.0.1:1/000000000000/missing"},
    {"type": "kinesis", "stream": "does-not-exist"},
    {"type": "sns", "topic_arn": "arn:aws:sns:us-east-1:123456789012:nope"},
])
def test_missing_target_is_a_sink_error(spec: dict[str, Any], moto_server: str) -> None:
    sink = build_sink({**spec, "endpoint_url": moto_server, "region": "us-east-1"})
    with pytest.raises(SinkError, match=spec["type"]):
        sink.publish(EVENT)


class Flaky:
    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.got: list[Mapping[str, Any]] = []

    def publish(self, event: Mapping[str, Any]) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise SinkError("flaky: endpoint unreachable")
        self.got.append(event)


@pytest.fixture(params=["local", "s3"])
def outbox_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The outbox's place: a local directory, or an S3 prefix (a working root hosts share)."""
    if request.param == "local":
        return str(tmp_path / "outbox")
    return f"s3://{request.getfixturevalue('s3_bucket')}/work"


def _outbox(place: str, moto: str | None = None) -> Outbox:
    if not place.startswith("s3://"):
        return Outbox(place)
    return Outbox(WorkRoot.open(place, {"endpoint_url": moto, "path_style": True}).part("_outbox"))


def test_outbox_keeps_undelivered_events_and_retries_in_order(outbox_store: str,
                                                               request: pytest.FixtureRequest) -> None:
    moto = request.getfixturevalue("moto_server") if outbox_store.startswith("s3://") else None
    outbox, sink = _outbox(outbox_store, moto), Flaky(failures=2)
    outbox.enqueue(EVENT, [sink])  # a rerun of the same commit keeps one event, its place and retries
    second = {**EVENT, "id": "public.users:diff:0/30", "to_position": "0/30"}
    outbox.enqueue(EVENT, [sink])
    outbox.enqueue(second, [sink])
    assert outbox.depth() == 2
    r = outbox.deliver([sink], now=0)
    assert (r.delivered, r.failed, r.pending) == (0, 1, 2) and "unreachable" in r.errors[0]
    assert outbox.deliver([sink], now=1).delivered == 0  # backing off: not due yet
    r = outbox.deliver([sink], now=100)
    assert (r.delivered, r.failed) == (0, 1)
    r = outbox.deliver([sink], now=1000)
    assert (r.delivered, r.pending) == (2, 0)
    assert [e["id"] for e in sink.got] == [EVENT["id"], second["id"]]
    assert _outbox(outbox_store, moto).depth() == 0


def test_outbox_survives_a_restart(tmp_path: Path) -> None:
    Outbox(tmp_path / "o").enqueue(EVENT, [Flaky(0)])
    sink = Flaky(0)
    assert Outbox(tmp_path / "o").deliver([sink]).delivered == 1 and sink.got == [EVENT]


def test_counters_in_object_storage_add_up_across_concurrent_writers(s3_bucket: str, moto_server: str) -> None:
    """Counters are read-modify-write with compare-and-swap: no increment of another process is lost."""
    from concurrent.futures import ThreadPoolExecutor

    from snapshot_assets.counters import CounterStore

    work = WorkRoot.open(f"s3://{s3_bucket}/work", {"endpoint_url": moto_server, "path_style": True})

    def count(n: int) -> None:
        store = CounterStore(work.part("_metrics"), "public.users")  # one per "process"
        for _ in range(n):
            store.add("artifacts_written_total", "diff")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(count, [5, 5, 5, 5]))
    assert CounterStore(work.part("_metrics"), "public.users").read() == {"artifacts_written_total": {"diff": 20.0}}
