"""Build event sinks from config specs (`events = [ {type = sns|sqs|kinesis|file, ...} ]`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from resources.aws_credentials import CredentialProfiles
from resources.sinks.aws import KinesisSink, SnsSink, SqsSink
from resources.sinks.base import EventSink
from resources.sinks.file import FileSink

ClientFactory = Callable[[str, Mapping[str, Any]], Any]


def default_client(service: str, spec: Mapping[str, Any]) -> Any:
    """A boto3 client on the ambient credential chain, with sink timeouts.

    Configured profiles plug in as `client=CredentialProfiles(...).sink_client`; without them a spec
    naming a profile fails (ProfileError) rather than silently acting as the ambient principal.
    """
    return CredentialProfiles.shared().sink_client(service, spec)


def build_sink(spec: Mapping[str, Any], client: ClientFactory = default_client) -> EventSink:
    kind = spec.get("type")
    if kind == "file":
        return FileSink(spec["path"])
    if kind == "sns":
        return SnsSink(client("sns", spec), spec["topic_arn"])
    if kind == "sqs":
        return SqsSink(client("sqs", spec), spec["queue_url"])
    if kind == "kinesis":
        return KinesisSink(client("kinesis", spec), spec["stream"])
    raise ValueError(f"unknown event sink type {kind!r}; expected file, sns, sqs or kinesis")
