"""The event sinks resource: where each table's commit events go (SNS, SQS, Kinesis, a file).

Registered in Definitions as `event_sinks`; the manifest asset notifies through it after a commit.
AWS sinks sign as the credentials profile their spec names.
"""

from __future__ import annotations

import dagster as dg

from resources.aws_credentials import CredentialProfiles
from resources.sinks.base import EventSink
from resources.sinks.factory import build_sink
from snapshot_assets.config import TableConfig


class EventSinksResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    def for_table(self, table: TableConfig, profiles: CredentialProfiles) -> list[EventSink]:
        return [build_sink(spec, client=profiles.sink_client) for spec in table.events]
