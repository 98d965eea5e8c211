"""What bad input and bad days get, at the pipeline's commit seam (no Spark): moto_server over HTTP.

A bucket that does not exist, a topic/queue/stream that does not exist, a second writer on the
same prefix, an S3 endpoint that stops answering in the middle of the manifest write: clear errors
naming the component and the profile, a manifest that stays valid, an outbox that keeps what it
could not deliver, and a next attempt that converges.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ConnectionClosedError

from resources.aws_credentials import CredentialProfiles
from resources.destinations.base import DestinationError
from snapshot_assets.archive.positions import comparator
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.verify import verify_archive
from snapshot_assets.counters import DESTINATION_ERRORS, EVENT_ERRORS
from snapshot_assets.pipeline.commit import CommitConflict
from snapshot_assets.pipeline.table import TablePipeline
from tests.aws.conftest import Moto
from tests.aws.support import bucket, client, diff, s3_dest, snapshot, table

pytestmark = pytest.mark.s3
ACCOUNT = "123456789012"
EVENTS = 'events { type = ambient, region = us-east-1 }'
ARCHIVE = 'archive { type = ambient, region = us-east-1 }'


def sound(pipe: TablePipeline) -> list[str]:
    return [p for d in pipe.destinations for p in verify_archive(ArchiveReader(d, pipe.cfg.key_prefix,
                                                                               cmp=comparator("lsn")))]


def identities(pipe: TablePipeline) -> list[tuple[str, str]]:
    return [(a.kind, a.to_position) for a in pipe.manifest().artifacts]


def test_a_bucket_that_does_not_exist(moto_server: str, tmp_path: Path) -> None:
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    pipe = TablePipeline(table(tmp_path, [s3_dest(missing, moto_server, "archive")], credentials=ARCHIVE))
    with pytest.raises(DestinationError) as raised:
        pipe.manifest()
    message = str(raised.value)
    assert "NoSuchBucket" in message and missing in message
    assert f"[s3 destination s3://{missing}/archive/ as credentials profile 'archive']" in message
    assert pipe.counters.read()[DESTINATION_ERRORS] == {f"s3://{missing}/archive/": 1}


def _sns(endpoint: str) -> tuple[dict[str, Any], Callable[[], Callable[[], list[Any]]]]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    spec = {"type": "sns", "topic_arn": f"arn:aws:sns:us-east-1:{ACCOUNT}:{name}"}

    def create() -> Callable[[], list[Any]]:
        sns, sqs = client("sns", endpoint), client("sqs", endpoint)
        topic = sns.create_topic(Name=name)["TopicArn"]
        assert topic == spec["topic_arn"]
        url = sqs.create_queue(QueueName=f"sub-{name}")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
        return lambda: [json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
                        .get("Messages", [])]
    return spec, create


def _sqs(endpoint: str) -> tuple[dict[str, Any], Callable[[], Callable[[], list[Any]]]]:
    name = f"q-{uuid.uuid4().hex[:8]}"
    spec = {"type": "sqs", "queue_url": f"{endpoint}/{ACCOUNT}/{name}"}

    def create() -> Callable[[], list[Any]]:
        sqs = client("sqs", endpoint)
        url = sqs.create_queue(QueueName=name)["QueueUrl"]
        assert url == spec["queue_url"]
        return lambda: [json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
                        .get("Messages", [])]
    return spec, create


def _kinesis(endpoint: str) -> tuple[dict[str, Any], Callable[[], Callable[[], list[Any]]]]:
    name = f"s-{uuid.uuid4().hex[:8]}"
    spec = {"type": "kinesis", "stream": name}

    def create() -> Callable[[], list[Any]]:
        kin = client("kinesis", endpoint)
        kin.create_stream(StreamName=name, ShardCount=1)

        def read() -> list[Any]:
            shard = kin.describe_stream(StreamName=name)["StreamDescription"]["Shards"][0]["ShardId"]
            it = kin.get_shard_iterator(StreamName=name, ShardId=shard,
                                        ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            return [json.loads(r["Data"]) for r in kin.get_records(ShardIterator=it)["Records"]]
        return read
    return spec, create


@pytest.mark.parametrize("target", [_sns, _sqs, _kinesis], ids=["sns-topic", "sqs-queue", "kinesis-stream"])
def test_a_sink_target_that_does_not_exist_keeps_the_event_in_the_outbox(
        target: Callable[[str], tuple[dict[str, Any], Callable[[], Callable[[], list[Any]]]]],
        moto_server: str, tmp_path: Path) -> None:
    spec, create = target(moto_server)
    spec.update(endpoint_url=moto_server, region="us-east-1", credentials="events")
    pipe = TablePipeline(table(tmp_path, [s3_dest(bucket(moto_server), moto_server)], events=[json.dumps(spec)],
                               credentials=EVENTS))
    sink = pipe.sinks[0]

    report = pipe.commit(snapshot(pipe))  # the commit is never blocked or undone by a sink

    assert identities(pipe) == [("snapshot", "0/10")]
    assert (report.delivery.delivered, report.delivery.failed, report.delivery.pending) == (0, 1, 1)
    error = report.delivery.errors[0]
    assert error.startswith(f"{sink.name}: ") and "as credentials profile 'events']" in error
    assert any(code in error for code in ("NotFound", "NonExistentQueue", "ResourceNotFound")), error
    assert pipe.counters.read()[EVENT_ERRORS] == {sink.name: 1}

    received = create()  # the target appears; the retry (the outbox_retry sensor's call) delivers, once
    again = pipe.outbox.deliver(pipe.sinks, now=time.time() + 60)
    assert (again.delivered, again.pending) == (1, 0)
    assert pipe.outbox.deliver(pipe.sinks, now=time.time() + 600).delivered == 0
    assert [e["id"] for e in received()] == ["public.users:snapshot:0/10"]


def test_a_second_writer_on_the_same_prefix_is_refused_by_the_cas(moto_server: str, tmp_path: Path) -> None:
    dests = [s3_dest(bucket(moto_server), moto_server)]
    first = TablePipeline(table(tmp_path / "a", dests), profiles=CredentialProfiles())
    second_profiles = CredentialProfiles()
    raced = threading.Event()
    first.commit(snapshot(first))
    ours = diff(first, "0/10", "0/20")

    def the_first_writer_commits_in_between(params: dict[str, Any], **_: Any) -> None:
        if params["url_path"].endswith("manifest.json") and not raced.is_set():
            raced.set()
            first.commit(ours)  # after the second writer read revision N, before its CAS on N

    second_profiles.session().events.register("before-call.s3.PutObject", the_first_writer_commits_in_between)
    second = TablePipeline(table(tmp_path / "b", dests), profiles=second_profiles)
    theirs = diff(second, "0/10", "0/30", ident=2)

    with pytest.raises(CommitConflict, match="does not continue the chain at '0/20'"):
        second.commit(theirs)

    assert raced.is_set()
    assert identities(first) == identities(second) == [("snapshot", "0/10"), ("diff", "0/20")]
    assert sound(first) == []


@pytest.mark.parametrize("landed", [False, True], ids=["frozen-mid-write", "dropped-after-the-write-landed"])
def test_the_endpoint_stops_answering_during_the_manifest_write(own_moto: Moto, moto_server: str,
                                                               tmp_path: Path, landed: bool) -> None:
    """The endpoint freezes while the manifest is written — before the PUT is answered, or right after
    it landed (the connection drops, then the endpoint stops answering the re-read). The commit fails
    within the outage either way; once the endpoint is back, the leftover artifact is settled (its
    event sent) if the write had landed, or committed again if not: no loss, no duplicate."""
    queue_url = client("sqs", moto_server).create_queue(QueueName=f"q-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    sqs = json.dumps({"type": "sqs", "queue_url": queue_url, "endpoint_url": moto_server, "region": "us-east-1"})
    dest = s3_dest(bucket(own_moto.url), own_moto.url, "archive", connect_timeout=0.5, read_timeout=0.5,
                   max_attempts=2)
    cfg = table(tmp_path, [dest], events=[sqs], credentials=ARCHIVE)
    profiles = CredentialProfiles(cfg.credentials)
    armed, outage_s = threading.Event(), 6.0

    def outage() -> None:
        armed.clear()
        own_moto.freeze()
        threading.Timer(outage_s, own_moto.thaw).start()

    def freeze_before_the_answer(request: Any, **_: Any) -> None:
        if armed.is_set() and request.method == "PUT" and request.url.endswith("manifest.json"):
            outage()

    def drop_after_the_write(http_response: Any, model: Any, **_: Any) -> None:
        if armed.is_set() and http_response.url.endswith("manifest.json") and http_response.status_code == 200:
            outage()
            raise ConnectionClosedError(endpoint_url=http_response.url)

    events = profiles.session("archive").events
    if landed:
        events.register("after-call.s3.PutObject", drop_after_the_write)
    else:
        events.register("before-send.s3.PutObject", freeze_before_the_answer)
    pipe = TablePipeline(cfg, profiles=profiles)
    pipe.commit(snapshot(pipe))
    leftover = diff(pipe, "0/10", "0/20")
    armed.set()

    started = time.monotonic()
    with pytest.raises(DestinationError, match="outcome unknown"):
        pipe.commit(leftover)
    assert time.monotonic() - started < outage_s  # it failed while the endpoint was still down
    assert pipe.outbox.depth() == 0  # nothing announced: as far as this run knows, nothing was committed

    _wait_until_answering(pipe)
    # What the next artifact run does with the failed run's record. A PUT frozen mid-request may
    # still land when the endpoint wakes up (its bytes were in the socket), or not.
    settled = pipe.settle(leftover)
    assert settled or not landed
    if not settled:
        pipe.commit(leftover)  # the sensor asks for the same boundary again: same keys, one commit
    assert identities(pipe) == [("snapshot", "0/10"), ("diff", "0/20")] and sound(pipe) == []
    messages = client("sqs", moto_server).receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(json.loads(m["Body"])["id"] for m in messages) == [
        "public.users:diff:0/20", "public.users:snapshot:0/10"]
    errors = pipe.counters.read()[DESTINATION_ERRORS]  # the commit, and the reads that waited for the endpoint
    label = f"s3://{json.loads(dest)['bucket']}/archive/"
    assert list(errors) == [label] and errors[label] >= 1


def _wait_until_answering(pipe: TablePipeline, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pipe.manifest()
            return
        except DestinationError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_an_s3_only_archive_reads_the_previous_snapshot_in_place_as_the_base(moto_server: str, tmp_path: Path) -> None:
    """Without the STATE dataset (a wiped working root) an S3-only archive still re-bases: the Spark
    tasks read the previous snapshot object where it is, signed with the destination's connection."""
    name = bucket(moto_server)
    pipe = TablePipeline(table(tmp_path, [s3_dest(name, moto_server)], formats="[jsonl]"))
    pipe.commit(snapshot(pipe))
    previous = pipe.manifest().latest_snapshot()

    base = pipe._artifact_base(previous)

    assert base is not None and (base.format_id, base.position) == ("jsonl", "0/10")
    (path,) = base.paths
    assert path == pipe.destinations[0].uri("users/epoch=1/snapshot-0_10.jsonl") and path.startswith(f"s3://{name}/")
    assert base.s3 is not None and base.s3.endpoint_url == moto_server
