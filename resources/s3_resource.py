"""The credential profiles (aws_credentials.py) as Dagster resources: `aws_credentials` and
dagster-aws's S3Resource signed as a profile (`s3`, registered in the code location's Definitions).

A module of its own because importing dagster-aws costs a second or more (it loads Dagster's
components and storage modules): the command line's paths that start no Dagster run (a
`run --once` with nothing to write, `inspect`) use the profiles without paying for it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import boto3
import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import PrivateAttr

from resources.aws_credentials import S3_TIMEOUTS, CredentialProfiles, Timeouts
from snapshot_assets.config import load_config


class AwsCredentialsResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The code location's credential profiles as a Dagster resource (sessions and clients per profile).

    Reads the `credentials` block of the snapshotter configuration (`config_file`, default
    `$SNAPSHOTTER_CONFIG` or the demo config) and shares the process-wide registry with the
    pipeline, so an op and a destination using the same profile share its refreshing credentials.
    """

    config_file: str = ""
    _profiles: CredentialProfiles | None = PrivateAttr(default=None)

    def registry(self) -> CredentialProfiles:
        if self._profiles is None:
            self._profiles = CredentialProfiles.shared(load_config(self.config_file or None).credentials)
        return self._profiles

    def get_session(self, profile: str = "") -> boto3.session.Session:
        return self.registry().session(profile or None, component="the aws_credentials resource")

    def get_client(self, service: str, profile: str = "", *, region: str | None = None,
                   endpoint_url: str | None = None) -> Any:
        return self.registry().client(service, profile or None, component=f"the aws_credentials resource ({service})",
                                      region=region, endpoint_url=endpoint_url)


class ProfiledS3Resource(S3Resource):
    """dagster-aws's S3Resource, signed as a snapshotter credentials profile instead of static keys.

    Registered in the code location's Definitions as `s3`: every S3 destination's client is made
    here (`destination_client`), so the resource's settings are the code location's S3 defaults
    (an S3-compatible endpoint, its region, path-style addressing, the profile) and a destination
    spec's own keys override them. Drop-in for code that expects `S3Resource.get_client()`;
    `credentials` names the profile ("" = ambient). The parent's `profile_name` and static key
    fields are ignored (the profile decides); region, endpoint, max_attempts carry over.
    """

    credentials: str = ""
    path_style: bool = False
    config_file: str = ""

    def get_object_to_set_on_execution_context(self) -> Any:
        """The resource itself (S3Resource hands out a client): the `destinations` resource nests this one
        and asks it for one client per destination."""
        return self

    def get_client(self) -> Any:
        registry = CredentialProfiles.shared(load_config(self.config_file or None).credentials)
        return self.destination_client(registry, component="the s3 resource",
                                       timeouts=replace(S3_TIMEOUTS, max_attempts=self.max_attempts))

    def destination_client(self, profiles: CredentialProfiles, *, component: str, timeouts: Timeouts,
                           credentials: str | None = None, region: str | None = None,
                           endpoint_url: str | None = None, path_style: bool | None = None) -> Any:
        """An S3 client for one destination: its own settings where given (not None), else this resource's."""
        return profiles.client("s3", credentials or self.credentials or None, component=component,
                               region=region or self.region_name, endpoint_url=endpoint_url or self.endpoint_url,
                               path_style=self.path_style if path_style is None else path_style, timeouts=timeouts)
