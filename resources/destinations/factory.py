"""Build a Destination from a laredo-style destination config dict.

Accepted shapes (laredo's `destinations = [ ... ]` entries, plus this project's S3 endpoint keys):

    {type = local, path = "/var/archive"}
    {type = s3, bucket = "b", prefix = "tables/", region = "eu-west-1",
     endpoint_url = "http://minio:9000", path_style = true}

laredo's `credentials` (a profile name) is accepted but not resolved here: credential profiles
live in their own resource, which builds the boto3 client and passes it as `s3_client`. Keys that
neither laredo nor this project define are rejected so a typo (`endpoint` for `endpoint_url`) fails
loudly instead of silently writing to AWS. Optional `name` overrides the destination's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from resources.destinations.base import Destination
from resources.destinations.local import LocalDestination
from resources.destinations.s3 import S3Destination

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

_COMMON_KEYS = frozenset({"type", "name", "credentials"})
_LOCAL_KEYS = frozenset({"path"})
_S3_KEYS = frozenset({"bucket", "prefix", "region", "endpoint_url", "path_style"})
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


def _build_s3(spec: Mapping[str, Any], s3_client: S3Client | None) -> Destination:
    return S3Destination(
        bucket=_required(spec, "bucket"),
        prefix=_optional(spec, "prefix") or "",
        region=_optional(spec, "region"),
        endpoint_url=_optional(spec, "endpoint_url"),
        path_style=_flag(spec, "path_style"),
        client=s3_client,
        name=_optional(spec, "name") or "s3",
    )


_BUILDERS: dict[str, Callable[[Mapping[str, Any], S3Client | None], Destination]] = {
    "local": _build_local,
    "s3": _build_s3,
}


def build_destination(spec: Mapping[str, Any], *, s3_client: S3Client | None = None) -> Destination:
    """The destination `spec` describes; ValueError naming what is unknown or missing.

    `s3_client` (optional) is used by an s3 destination instead of a client built from the spec's
    region/endpoint, e.g. one made from a credential profile.
    """
    kind = str(spec.get("type") or "")
    builder = _BUILDERS.get(kind)
    if builder is None:
        known = ", ".join(sorted(_BUILDERS))
        raise ValueError(f"unknown destination type {kind!r} (known types: {known})")
    unknown = sorted(set(spec) - _KNOWN_KEYS)
    if unknown:
        raise ValueError(f"{kind} destination: unknown keys {unknown} (known: {sorted(_KNOWN_KEYS)})")
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
