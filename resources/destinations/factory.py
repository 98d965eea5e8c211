"""Build a Destination from a laredo-style destination config dict.

Accepted shapes (laredo's `destinations = [ ... ]` entries, plus this project's S3 endpoint keys):

    {type = local, path = "/var/archive"}
    {type = s3, bucket = "b", prefix = "tables/", region = "eu-west-1",
     endpoint_url = "http://minio:9000", path_style = true}

laredo's `credentials` (a profile name) is resolved through `profiles` (resources/aws_credentials.py):
the s3 client is made by the `s3` resource (dagster-aws's S3Resource, whose settings fill what the
spec leaves out), signed as that profile, and its errors name the destination and the profile; an
explicit `s3_client` wins. `connect_timeout`, `read_timeout` (seconds), `max_attempts` and
`multipart_threshold` (bytes) tune the S3 client and uploads. Keys that
neither laredo nor this project define are rejected so a typo (`endpoint` for `endpoint_url`) fails
loudly instead of silently writing to AWS. Optional `name` overrides the destination's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from resources.aws_credentials import S3_TIMEOUTS, CredentialProfiles, Timeouts
from resources.destinations.base import Destination
from resources.destinations.local import LocalDestination
from resources.destinations.s3 import S3Destination

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

    from resources.s3_resource import ProfiledS3Resource

_COMMON_KEYS = frozenset({"type", "name", "credentials"})
_LOCAL_KEYS = frozenset({"path"})
_S3_KEYS = frozenset({"bucket", "prefix", "region", "endpoint_url", "path_style", "connect_timeout", "read_timeout",
                      "max_attempts", "multipart_threshold"})
# laredo's config structs carry every field for every type (empty when unused), so a local spec
# may arrive with `bucket = ""`: tolerate the other type's keys, reject anything else.
_KNOWN_KEYS = _COMMON_KEYS | _LOCAL_KEYS | _S3_KEYS
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0", ""})


def _required(spec: Mapping[str, Any], key: str) -> str:
    value = spec.get(key)
    if value is None or str(value) == "":
        raise ValueError(f"{spec.get('type')} destination requires {key!r}")
    return str(value)


def _optional(spec: Mapping[str, Any], key: str) -> str | None:
    value = spec.get(key)
    return None if value is None or str(value) == "" else str(value)


def _flag(spec: Mapping[str, Any], key: str) -> bool:
    """A boolean that may arrive as a HOCON/env string (`"true"`)."""
    value = spec.get(key, False)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"destination {key!r} must be a boolean, got {value!r}")


def _build_local(spec: Mapping[str, Any], _s3_client: S3Client | None) -> Destination:
    return LocalDestination(_required(spec, "path"), name=_optional(spec, "name") or "local")


def _timeouts(spec: Mapping[str, Any]) -> Timeouts:
    return Timeouts(connect=float(spec.get("connect_timeout") or S3_TIMEOUTS.connect),
                    read=float(spec.get("read_timeout") or S3_TIMEOUTS.read),
                    max_attempts=int(spec.get("max_attempts") or S3_TIMEOUTS.max_attempts))


def _build_s3(spec: Mapping[str, Any], s3_client: S3Client | None,
              profiles: CredentialProfiles | None = None) -> Destination:
    timeouts = _timeouts(spec)
    threshold = _optional(spec, "multipart_threshold")
    # Recorded so a multipart upload can sign the same way in a Spark task on another host.
    named = _optional(spec, "credentials") or ""
    known = tuple((profiles or CredentialProfiles.shared()).profiles.values()) if named else ()
    return S3Destination(
        bucket=_required(spec, "bucket"),
        prefix=_optional(spec, "prefix") or "",
        region=_optional(spec, "region"),
        endpoint_url=_optional(spec, "endpoint_url"),
        path_style=_flag(spec, "path_style"),
        client=s3_client,
        name=_optional(spec, "name") or "s3",
        connect_timeout=timeouts.connect,
        read_timeout=timeouts.read,
        max_attempts=timeouts.max_attempts,
        credentials=named,
        profiles=known,
        **({"multipart_threshold": int(threshold)} if threshold is not None else {}),
    )


def _optional_flag(spec: Mapping[str, Any], key: str) -> bool | None:
    """A boolean the spec may leave unset (absent or "", as laredo's structs carry it): None then."""
    return None if spec.get(key) is None or spec.get(key) == "" else _flag(spec, key)


def _s3_client(spec: Mapping[str, Any], profiles: CredentialProfiles | None, s3: ProfiledS3Resource | None) -> S3Client:
    """The destination's client from the `s3` resource (its defaults when None): the spec's keys first,
    the resource's settings after."""
    if s3 is None:
        from resources.s3_resource import ProfiledS3Resource  # imports dagster-aws: only for an s3 destination

        s3 = ProfiledS3Resource()
    component = f"s3 destination s3://{_required(spec, 'bucket')}/{_optional(spec, 'prefix') or ''}"
    client: S3Client = s3.destination_client(
        profiles if profiles is not None else CredentialProfiles.shared(), component=component,
        timeouts=_timeouts(spec), credentials=_optional(spec, "credentials"), region=_optional(spec, "region"),
        endpoint_url=_optional(spec, "endpoint_url"), path_style=_optional_flag(spec, "path_style"))
    return client


_BUILDERS: dict[str, Callable[[Mapping[str, Any], S3Client | None], Destination]] = {
    "local": _build_local,
    "s3": _build_s3,
}


def build_destination(spec: Mapping[str, Any], *, s3_client: S3Client | None = None,
                      profiles: CredentialProfiles | None = None, s3: ProfiledS3Resource | None = None) -> Destination:
    """The destination `spec` describes; ValueError naming what is unknown or missing.

    An s3 destination's client comes from `s3` (the code location's registered S3Resource; its
    defaults when None), signed as the spec's `credentials` profile looked up in `profiles` (a spec
    naming a profile without `profiles` fails: there is nothing to resolve it in). `s3_client`
    (optional) replaces the client altogether.
    """
    kind = str(spec.get("type") or "")
    builder = _BUILDERS.get(kind)
    if builder is None:
        known = ", ".join(sorted(_BUILDERS))
        raise ValueError(f"unknown destination type {kind!r} (known types: {known})")
    unknown = sorted(set(spec) - _KNOWN_KEYS)
    if unknown:
        raise ValueError(f"{kind} destination: unknown keys {unknown} (known: {sorted(_KNOWN_KEYS)})")
    if kind == "s3":
        client = s3_client if s3_client is not None else _s3_client(spec, profiles, s3)
        return _build_s3(spec, client, profiles)
    return builder(spec, s3_client)


def location_spec(store: str, *, path: str | None = None, bucket: str | None = None, prefix: str = "",
                  region: str | None = None, endpoint_url: str | None = None,
                  path_style: bool = False) -> dict[str, Any]:
    """A destination spec from flat location flags (the CLI's and the Dagster jobs' shape)."""
    if store == "local":
        if not path:
            raise ValueError("a local archive location needs a path")
        return {"type": "local", "path": path}
    if store != "s3":
        raise ValueError(f"unknown store {store!r}; expected local or s3")
    if not bucket:
        raise ValueError("an s3 archive location needs a bucket")
    spec = {"type": "s3", "bucket": bucket, "prefix": prefix, "region": region, "endpoint_url": endpoint_url,
            "path_style": path_style}
    return {k: v for k, v in spec.items() if v is not None}
