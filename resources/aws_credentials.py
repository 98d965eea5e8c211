"""Credential profiles: which AWS principal each component acts as, as boto3 Sessions (the Dagster
resources built on them are in s3_resource.py).

Why profiles: every S3 destination and every event sink names the profile it acts as
(`credentials = <name>`), so each can hold a least-privilege role of its own — the archive writer
cannot publish, the publisher cannot write the archive. Why this module and not boto3 profiles:
the code location is a long-running process (Dagster code server, daemon, run workers), so an
assumed role must be assumed lazily (on the first request, never at import) and refreshed before
it expires, for as long as the process lives. botocore's `DeferredRefreshableCredentials` does the
timing (advisory refresh 15 minutes before expiry, mandatory at 10); this module supplies the
AssumeRole call, on top of the `base` profile's credentials or the ambient chain.

Errors are meant to be read by an operator at 3 a.m.: a configuration mistake (unknown profile,
missing role_arn, a `base` cycle) is a `ProfileError` (a ValueError) naming the component and the
profile; a runtime failure to get credentials (STS unreachable, access denied, refused base
credentials, expired and not refreshable) is a `CredentialError`. It is a BotoCoreError on purpose:
it surfaces from inside a boto3 call (credentials are fetched when the request is signed), and the
destinations and sinks already turn BotoCoreErrors into errors naming themselves. Every client is
also labelled, so a service's own error message (AccessDenied, NoSuchBucket, ...) ends with the
component and the profile it was signed as.
"""

from __future__ import annotations

import datetime as _dt
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import boto3
import botocore.session
from botocore.config import Config
from botocore.credentials import CredentialProvider, CredentialResolver, DeferredRefreshableCredentials
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError

from resources.destinations.s3 import S3_SIGNATURE
from snapshot_assets.config import CredentialProfile
from snapshot_assets.redaction import register_secret

AMBIENT = CredentialProfile(name="", type="ambient")
Clock = Callable[[], _dt.datetime]


class ProfileError(ValueError):
    """A profile cannot be used as configured (unknown, incomplete, a cycle of bases)."""


class CredentialError(BotoCoreError):
    """A profile could not produce credentials right now; the message names the profile and why."""

    fmt = "{message}"

    def __init__(self, message: str) -> None:
        super().__init__(message=message)


@dataclass(frozen=True)
class Timeouts:
    """Network bounds of one client: seconds to connect, seconds to wait for a response, tries in all."""

    connect: float
    read: float
    max_attempts: int


S3_TIMEOUTS = Timeouts(connect=10.0, read=60.0, max_attempts=5)
# A sink is called right after the commit: a dead endpoint must not hold the run for minutes
# (the outbox retries later anyway).
SINK_TIMEOUTS = Timeouts(connect=5.0, read=15.0, max_attempts=3)
# STS is on the signing path of every component: fail fast, the caller's own retries come on top.
STS_TIMEOUTS = Timeouts(connect=2.0, read=5.0, max_attempts=2)


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def _config(timeouts: Timeouts, *, path_style: bool | None = None) -> Config:
    s3: Any = {"addressing_style": "path" if path_style else "auto"} if path_style is not None else None
    return Config(s3=s3, connect_timeout=timeouts.connect, read_timeout=timeouts.read, tcp_keepalive=True,
                  retries={"total_max_attempts": timeouts.max_attempts, "mode": "standard"},
                  signature_version=S3_SIGNATURE if path_style is not None else None)


def describe_profile(profile: CredentialProfile) -> str:
    return f"credentials profile {profile.name!r}" if profile.name else "the ambient credentials"


class _Provider(CredentialProvider):
    """Hands botocore one fixed (refreshable) credentials object instead of searching the chain."""

    METHOD = "snapshotter-profile"
    CANONICAL_NAME = "snapshotter-profile"

    def __init__(self, credentials: DeferredRefreshableCredentials) -> None:
        super().__init__()
        self._credentials = credentials

    def load(self) -> DeferredRefreshableCredentials:
        return self._credentials


class _AssumeRole:
    """The refresh function of one assume_role profile: one AssumeRole call, errors made readable."""

    def __init__(self, profile: CredentialProfile, base: boto3.session.Session, base_name: str,
                 clock: Clock) -> None:
        self.profile, self.base, self.base_name, self.clock = profile, base, base_name, clock
        self._sts: Any = None
        self._expiry: _dt.datetime | None = None
        self.calls = 0

    def __call__(self) -> dict[str, str]:
        self.calls += 1
        args = {"RoleArn": self.profile.role_arn,
                "RoleSessionName": self.profile.session_name or f"snapshotter-{self.profile.name}"[:64]}
        if self.profile.external_id:
            args["ExternalId"] = self.profile.external_id
        try:
            creds = self._client().assume_role(**args)["Credentials"]
        except ClientError as exc:
            raise self._error(self._refused(exc)) from exc
        except CredentialError as exc:  # the base profile could not sign the AssumeRole call
            raise self._error(f"its base failed: {exc}") from exc
        except NoCredentialsError as exc:
            raise self._error(f"{self.base_name} found no credentials to call STS with") from exc
        except BotoConnectionError as exc:
            raise self._error(f"the STS endpoint is unreachable ({exc})") from exc
        except BotoCoreError as exc:
            raise self._error(f"STS failed: {exc}") from exc
        self._expiry = creds["Expiration"]
        for part in ("SecretAccessKey", "SessionToken"):  # botocore's debug logs show the token header
            register_secret(creds[part], slot=f"assumed {self.profile.name} {part}")
        return {"access_key": creds["AccessKeyId"], "secret_key": creds["SecretAccessKey"],
                "token": creds["SessionToken"], "expiry_time": creds["Expiration"].isoformat()}

    def _client(self) -> Any:
        if self._sts is None:  # created on first use: nothing connects before a component needs credentials
            self._sts = self.base.client("sts", region_name=self.profile.region or None,
                                         endpoint_url=self.profile.endpoint_url or None, config=_config(STS_TIMEOUTS))
        return self._sts

    def _refused(self, exc: ClientError) -> str:
        error = exc.response.get("Error", {})
        code, message = str(error.get("Code", "")), str(error.get("Message", ""))
        if code == "AccessDenied":
            needs = "the role's trust policy" + (" (and its sts:ExternalId condition)" if self.profile.external_id
                                                 else "")
            return (f"access denied assuming {self.profile.role_arn}: {message} — check {needs} and that "
                    f"{self.base_name} may call sts:AssumeRole on it")
        if code in ("ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "SignatureDoesNotMatch",
                    "UnrecognizedClientException"):
            return f"STS refused {self.base_name} ({code}: {message}); renew or fix those credentials"
        return f"AssumeRole {self.profile.role_arn} failed: {code}: {message}"

    def _error(self, why: str) -> CredentialError:
        when = ""
        if self._expiry is not None:
            verb = "expired" if self.clock() >= self._expiry else "expire"
            when = f" (the credentials assumed before {verb} at {self._expiry.isoformat()})"
        return CredentialError(f"{describe_profile(self.profile)}: cannot assume role {self.profile.role_arn}: "
                               f"{why}{when}")


class CredentialProfiles:
    """The configured profiles of a process: one lazily built boto3 Session each, and clients from them.

    Sessions are cached for the life of the object, so an assumed role's refreshable credentials
    are shared by every client of that profile. boto3 Sessions are not thread-safe while creating
    clients (finished clients are), so creation is serialized here.
    """

    _shared: ClassVar[dict[frozenset[CredentialProfile], CredentialProfiles]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, profiles: Mapping[str, CredentialProfile] | None = None, *, clock: Clock = _now) -> None:
        self.profiles = dict(profiles or {})
        self.clock = clock
        self._sessions: dict[str, boto3.session.Session] = {}
        self._fetchers: dict[str, _AssumeRole] = {}
        self._lock = threading.RLock()
        for profile in self.profiles.values():
            self._chain(profile, "the configuration")

    @classmethod
    def shared(cls, profiles: Mapping[str, CredentialProfile] | None = None) -> CredentialProfiles:
        """The process-wide registry for this set of profiles (every table of a config shares it)."""
        key = frozenset((profiles or {}).values())
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls(profiles)
            return cls._shared[key]

    # ---- lookups ----------------------------------------------------------------------------------

    def profile(self, name: str | None, component: str = "") -> CredentialProfile:
        """The profile `name` (None or "": the ambient chain); ProfileError naming `component` if unknown."""
        if not name:
            return AMBIENT
        profile = self.profiles.get(name)
        if profile is None:
            known = ", ".join(sorted(self.profiles)) or "none are configured"
            raise ProfileError(f"{component or 'a component'}: unknown credentials profile {name!r} (known: {known})")
        return profile

    def _chain(self, profile: CredentialProfile, component: str) -> None:
        """Validate `profile` and its bases: role_arn present, every base known, no cycle."""
        seen: list[str] = []
        current: CredentialProfile | None = profile
        while current is not None and current.name:
            if current.name in seen:
                raise ProfileError(f"{component}: credentials profiles form a cycle of bases: "
                                   f"{' -> '.join([*seen, current.name])}")
            seen.append(current.name)
            if current.type == "assume_role" and not current.role_arn:
                raise ProfileError(f"{component}: {describe_profile(current)} is assume_role but has no role_arn")
            if current.type not in ("ambient", "assume_role"):
                raise ProfileError(f"{component}: {describe_profile(current)} has unknown type {current.type!r}")
            current = self.profile(current.base, f"{component} ({describe_profile(current)}.base)") \
                if current.base else None

    # ---- sessions and clients -----------------------------------------------------------------------

    def session(self, name: str | None = None, *, component: str = "") -> boto3.session.Session:
        """The boto3 Session of profile `name`; nothing is called on AWS until a request is signed."""
        profile = self.profile(name, component)
        with self._lock:
            session = self._sessions.get(profile.name)
            if session is None:
                session = self._build(profile)
                self._sessions[profile.name] = session
            return session

    def _build(self, profile: CredentialProfile) -> boto3.session.Session:
        if profile.type == "ambient":
            return boto3.session.Session(region_name=profile.region or None)
        base = self.profile(profile.base)
        fetcher = _AssumeRole(profile, self.session(base.name), describe_profile(base), self.clock)
        self._fetchers[profile.name] = fetcher
        credentials = DeferredRefreshableCredentials(fetcher, "snapshotter-assume-role", time_fetcher=self.clock)
        core = botocore.session.Session()
        core.register_component("credential_provider", CredentialResolver([_Provider(credentials)]))
        return boto3.session.Session(botocore_session=core, region_name=profile.region or None)

    def client(self, service: str, name: str | None = None, *, component: str, region: str | None = None,
               endpoint_url: str | None = None, path_style: bool | None = None,
               timeouts: Timeouts = S3_TIMEOUTS) -> Any:
        """A `service` client signed as profile `name`, its errors labelled with `component` and the profile."""
        profile = self.profile(name, component)
        session = self.session(profile.name, component=component)
        with self._lock:
            make: Callable[..., Any] = session.client  # the service name is data here, not a literal
            client = make(service, region_name=region or profile.region or None, endpoint_url=endpoint_url or None,
                          config=_config(timeouts, path_style=path_style if service == "s3" else None))
        client.meta.events.register("after-call", _labeller(f"{component} as {describe_profile(profile)}"))
        return client

    def sink_client(self, service: str, spec: Mapping[str, Any]) -> Any:
        """The `resources.sinks.factory.ClientFactory` of these profiles (an event sink's client)."""
        target = spec.get("topic_arn") or spec.get("queue_url") or spec.get("stream") or ""
        return self.client(service, spec.get("credentials") or None, component=f"{service} sink {target}",
                           region=spec.get("region") or None, endpoint_url=spec.get("endpoint_url") or None,
                           timeouts=SINK_TIMEOUTS)

    def assume_role_calls(self, name: str) -> int:
        """How many AssumeRole calls profile `name` made so far (observability and tests)."""
        fetcher = self._fetchers.get(name)
        return fetcher.calls if fetcher else 0


def _labeller(label: str) -> Callable[..., None]:
    """An after-call handler appending `[label]` to a service error's message (before botocore raises it)."""

    def label_error(http_response: Any, parsed: Any, **_: Any) -> None:
        error = parsed.get("Error") if isinstance(parsed, dict) else None
        if getattr(http_response, "status_code", 200) >= 300 and isinstance(error, dict):
            error["Message"] = f"{error.get('Message') or error.get('Code', 'error')} [{label}]"

    return label_error
