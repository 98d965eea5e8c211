"""SNS, SQS and Kinesis sinks on plain boto3 clients.

FIFO topics and queues get MessageGroupId = table (events of one table stay ordered) and a
deduplication id = the event's stable id. Message attributes carry table, kind and epoch where
the service has them. Every boto3 failure becomes a SinkError naming the sink and the cause.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from resources.sinks.base import SinkError
from snapshot_assets.archive.gojson import marshal


def _body(event: Mapping[str, Any]) -> str:
    return marshal(dict(event)).decode()


def _attributes(event: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    return {
        "table": {"DataType": "String", "StringValue": str(event.get("table", ""))},
        "kind": {"DataType": "String", "StringValue": str(event.get("kind", ""))},
        "epoch": {"DataType": "Number", "StringValue": str(event.get("epoch", 0))},
    }


def _dedup_id(event: Mapping[str, Any]) -> str:
    """FIFO deduplication ids are at most 128 chars of [A-Za-z0-9!-~]."""
    raw = str(event.get("id", ""))
    return "".join(c if 33 <= ord(c) <= 126 else "_" for c in raw)[:128]


class _BotoSink(ABC):
    kind = ""

    def __init__(self, client: Any, target: str, name: str = "") -> None:
        self.client = client
        self.target = target
        self.name = name or f"{self.kind}:{target}"

    def publish(self, event: Mapping[str, Any]) -> None:
        try:
            self._send(event)
        except (ClientError, BotoCoreError) as e:
            raise SinkError(f"{self.name}: {e}") from e

    @abstractmethod
    def _send(self, event: Mapping[str, Any]) -> None:
        """One service call delivering the event."""


class SnsSink(_BotoSink):
    kind = "sns"

    def _send(self, event: Mapping[str, Any]) -> None:
        args: dict[str, Any] = {"TopicArn": self.target, "Message": _body(event),
                                "MessageAttributes": _attributes(event)}
        if self.target.endswith(".fifo"):
            args.update(MessageGroupId=str(event.get("table", "")), MessageDeduplicationId=_dedup_id(event))
        self.client.publish(**args)


class SqsSink(_BotoSink):
    kind = "sqs"

    def _send(self, event: Mapping[str, Any]) -> None:
        args: dict[str, Any] = {"QueueUrl": self.target, "MessageBody": _body(event),
                                "MessageAttributes": _attributes(event)}
        if self.target.endswith(".fifo"):
            args.update(MessageGroupId=str(event.get("table", "")), MessageDeduplicationId=_dedup_id(event))
        self.client.send_message(**args)


class KinesisSink(_BotoSink):
    kind = "kinesis"

    def _send(self, event: Mapping[str, Any]) -> None:
        self.client.put_record(StreamName=self.target, Data=_body(event).encode(),
                               PartitionKey=str(event.get("table", "")) or "-")
