"""The destinations resource: every table's archive destinations, S3 clients from the registered `s3` resource.

Registered in Definitions as `destinations`, with the code location's `s3` resource (dagster-aws's
S3Resource, `ProfiledS3Resource`) nested in it, so the endpoint, region, path style and profile
an operator sets on `s3` (in code, by environment, or per run in the launchpad) reach every S3
destination whose spec leaves them out. Built per table from the configuration's `destinations`
through the one destination factory the CLI tools use too.
"""

# No `from __future__ import annotations`: Dagster recognises the nested `s3` resource by its
# evaluated annotation (a string one makes `configure_at_launch` fail validation).
import dagster as dg

from resources.aws_credentials import CredentialProfiles
from resources.destinations.base import Destination
from resources.destinations.factory import build_destination
from resources.s3_resource import ProfiledS3Resource
from snapshot_assets.config import TableConfig


class DestinationsResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    s3: ProfiledS3Resource

    def for_table(self, table: TableConfig, profiles: CredentialProfiles) -> list[Destination]:
        """The table's destinations, in configured order (the first is the one reads prefer)."""
        return [build_destination(spec, profiles=profiles, s3=self.s3) for spec in table.destinations]
