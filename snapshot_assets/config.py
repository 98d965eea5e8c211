"""The code location's configuration: one HOCON file, laredo-snapshotter's keys plus this project's.

A laredo `snapshotter.conf` loads unchanged (single-table form, or `tables = [...]`). Unlike
laredo, loading is strict: an unknown key, an unparseable duration or size, an unknown format,
destination, sink or credentials profile fails the load with the file, the key path and the bad
value — laredo silently turns such values into 0 or ignores them, which disables triggers
without anyone noticing.

Where the file comes from: `SNAPSHOTTER_CONFIG`, else the shipped demo config. Environment
overrides: HOCON `${?VAR}` substitutions, and `SNAPSHOTTER__A__B__0__C=value` variables, which set
`snapshotter.a.b[0].c` (list indices are numbers) before validation.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pyhocon import ConfigFactory, ConfigTree
from pyhocon.exceptions import ConfigException
from pyparsing import ParseBaseException

from resources.buffer.lease import DEFAULT_LEASE_S
from resources.capture.keys import KeyTemplateError, check_template
from resources.capture.settings import (
    COMPRESSIONS,
    INDEX_BACKENDS,
    PAGE_FORMATS,
    BufferSettings,
    CaptureSettings,
    IndexSettings,
    PageSettings,
    StorageSettings,
)
from resources.subscribers.tls import ClientTls, TlsError
from resources.work_storage import is_s3_uri
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.keys import default_key_prefix
from snapshot_assets.archive.policy import Policy
from snapshot_assets.archive.retention import DEFAULT_GRACE
from snapshot_assets.config_values import (
    ValueParseError,
    parse_bool,
    parse_count,
    parse_duration,
    parse_fraction,
    parse_size,
)
from snapshot_assets.groups.model import GROUP_NAME, GroupConfig, default_group_prefix
from snapshot_assets.redaction import dsn_problem, redact, register_dsn

DEFAULT_CONFIG = Path(__file__).resolve().parent / "demo.conf"
ENV_PREFIX = "SNAPSHOTTER__"
T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration problem, always naming the file and the key path (and never a secret: the
    message is redacted, because some messages quote the bad value or a whole subtree)."""

    def __init__(self, file: str, path: str, message: str) -> None:
        message = redact(message)
        super().__init__(f"{file}: {path}: {message}" if path else f"{file}: {message}")
        self.file, self.path = file, path


@dataclass(frozen=True)
class SourceConfig:
    type: str
    schema: str
    table: str
    server: str = ""
    client_id: str = ""
    local_snapshot_path: str = ""
    protocol: str = "connect"
    dsn: str = ""
    slot: str = ""
    publication: str = ""
    create_slot: bool = True
    recreate_slot_on_loss: bool = False
    unchanged_toast: str = "fill"
    generator: Mapping[str, Any] = field(default_factory=dict)
    tls: ClientTls | None = None  # laredo sources: TLS to the server (laredo serves gRPC only over TLS)

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True)
class BufferConfig:
    """`buffer { }`: the working root (the buffer, the state, the outbox, counters) and sealing.

    `path` is a local directory or `s3://bucket/prefix` (hosts that share no disk); `s3` holds the
    connection keys of an S3 root (a destination's: region, endpoint_url, credentials, ...); `lease`
    is how long an S3 buffer's writer lease lasts unrenewed (a successor takes over after it).
    """

    path: str = ".snapshotter/buffer"
    seal_interval: _dt.timedelta = _dt.timedelta(seconds=1)
    seal_changes: int = 10_000
    s3: Mapping[str, Any] = field(default_factory=dict)
    lease: _dt.timedelta = _dt.timedelta(seconds=DEFAULT_LEASE_S)


@dataclass(frozen=True)
class RetryConfig:
    """How long the sensors wait before trying a table's failed run again.

    After the Nth failed run in a row (an artifact run, or the table's ingest run) the next one
    waits `backoff * 2**(N-1)`, at most `max_backoff`: a dead destination or source is not hammered,
    and a short outage still costs little more than `backoff`.
    """

    backoff: _dt.timedelta = _dt.timedelta(seconds=30)
    max_backoff: _dt.timedelta = _dt.timedelta(minutes=5)

    def delay(self, failures: int) -> _dt.timedelta:
        """The wait after `failures` consecutive failed runs (none after none)."""
        if failures <= 0:
            return _dt.timedelta(0)
        doubled: _dt.timedelta = self.backoff * 2 ** min(failures - 1, 32)
        return min(doubled, self.max_backoff)


@dataclass(frozen=True)
class SparkConfig:
    remote: str = ""
    master: str = ""
    conf: Mapping[str, str] = field(default_factory=dict)
    # The local Spark Connect server (neither remote nor master) stops after this long without a
    # session; 0 keeps it until `snapshotter spark stop`. 15 minutes keeps a sensor's or a person's
    # runs warm without leaving a 1-2 GB JVM behind for good.
    local_server_idle_timeout: _dt.timedelta = _dt.timedelta(minutes=15)


@dataclass(frozen=True)
class CredentialProfile:
    name: str
    type: str
    region: str = ""
    role_arn: str = ""
    external_id: str = ""
    session_name: str = ""
    base: str = ""
    endpoint_url: str = ""  # the STS endpoint of an assume_role profile (tests, private endpoints)


#: The size (jsonl bytes) a full build aims at per state bucket: big enough that every bucket is a
#: valid S3 multipart part (>= 5 MiB) in each byte format, small enough that a re-base touching a few
#: buckets rewrites little.
DEFAULT_BUCKET_BYTES = 32 * 1024 * 1024
MIN_BUCKET_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class TableConfig:
    """One table. `key_fields` is what the file says, `()` when it says nothing: the key the source
    reports then names rows (a PostgreSQL table's primary key; laredo's `[id]` when a laredo server
    reports none). The effective key is resolved once, by `TablePipeline.key_fields`."""

    source: SourceConfig
    key_prefix: str
    key_fields: tuple[str, ...]
    diff_interval: _dt.timedelta
    policy: Policy
    keep_epochs: int
    destinations: tuple[Mapping[str, Any], ...]
    snapshot_formats: tuple[str, ...]
    diff_formats: tuple[str, ...]
    events: tuple[Mapping[str, Any], ...]
    buffer: BufferConfig
    credentials: Mapping[str, CredentialProfile] = field(default_factory=dict)  # the profiles specs may name
    retention_grace: _dt.timedelta = DEFAULT_GRACE  # retention.grace: how long a pruned object outlives its commit
    retry: RetryConfig = field(default_factory=RetryConfig)
    bucket_bytes: int = DEFAULT_BUCKET_BYTES  # state { bucket_size }: the jsonl bytes a state bucket aims at
    group: str = ""  # the co-refresh group the table belongs to (`groups = [...]`), "" for none

    @property
    def name(self) -> str:
        """The table's name as the manifest writes it (`schema.table`), also its Dagster partition key."""
        return self.source.qualified_table


@dataclass(frozen=True)
class SnapshotterConfig:
    file: str
    tables: tuple[TableConfig, ...]
    credentials: Mapping[str, CredentialProfile]
    http_port: int
    spark: SparkConfig
    capture: CaptureSettings | None = None  # `capture { }`: the event capture service (resources/capture)
    groups: tuple[GroupConfig, ...] = ()  # `groups = [...]`: co-refresh groups (snapshot_assets/groups)

    def group(self, name: str) -> GroupConfig:
        for g in self.groups:
            if g.name == name:
                return g
        known = ", ".join(g.name for g in self.groups) or "none"
        raise KeyError(f"no group {name!r} in {self.file}; configured: {known}")

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if name in (t.name, t.source.table):
                return t
        raise KeyError(f"no table {name!r} in {self.file}; configured: {', '.join(t.name for t in self.tables)}")


# ---- strict section reader ----------------------------------------------------------------------


class _Section:
    """One HOCON object being read: every key must be consumed, or it is reported as unknown."""

    def __init__(self, tree: Any, path: str, file: str) -> None:
        if not isinstance(tree, (ConfigTree, dict)):
            raise ConfigError(file, path, f"expected an object, got {tree!r}")
        self.tree, self.path, self.file = tree, path, file
        self.used: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.tree

    def raw(self, key: str) -> Any:
        self.used.add(key)
        return self.tree.get(key, None)

    def get(self, key: str, parse: Callable[[Any], T], default: T) -> T:
        if key not in self.tree:
            self.used.add(key)
            return default
        value = self.raw(key)
        try:
            return parse(value)
        except ValueParseError as e:
            raise ConfigError(self.file, self.at(key), str(e)) from None

    def string(self, key: str, default: str = "", *, required: bool = False,
               choices: tuple[str, ...] = ()) -> str:
        if required and key not in self.tree:
            raise ConfigError(self.file, self.at(key), "is required")
        value = self.get(key, _as_str, default)
        if choices and value not in choices:
            raise ConfigError(self.file, self.at(key), f"unknown value {value!r}; expected one of {', '.join(choices)}")
        return value

    def sub(self, key: str) -> _Section:
        value = self.raw(key)
        return _Section(value if value is not None else {}, self.at(key), self.file)

    def items(self, key: str) -> Iterator[_Section]:
        value = self.raw(key)
        if value is None:
            return
        if not isinstance(value, list):
            raise ConfigError(self.file, self.at(key), f"expected a list, got {value!r}")
        for i, item in enumerate(value):
            yield _Section(item, f"{self.at(key)}[{i}]", self.file)

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, (str, int)) for v in value):
            raise ConfigError(self.file, self.at(key), f"expected a list of strings, got {value!r}")
        return tuple(str(v) for v in value)

    def plain(self) -> dict[str, Any]:
        """Every key as plain Python values (for seams that validate their own keys)."""
        self.used.update(self.tree.keys())
        plain: dict[str, Any] = _plain(self.tree)
        return plain

    def done(self) -> None:
        unknown = sorted(set(self.tree.keys()) - self.used)
        if unknown:
            more = f" (and {', '.join(unknown[1:])})" if unknown[1:] else ""
            raise ConfigError(self.file, self.at(unknown[0]), f"unknown key {unknown[0]!r}{more}")


def _as_str(value: Any) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueParseError(f"expected a string, got {value!r}")


def _plain(value: Any) -> Any:
    if isinstance(value, (ConfigTree, dict)):
        # pyhocon keeps the quotes of a quoted key ("spark.sql.x" stays one key, quotes included).
        return {k.strip('"'): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# ---- the schema ---------------------------------------------------------------------------------

SOURCE_TYPES = ("laredo", "postgres", "generator")
# `source.unchanged_toast`: "fill" completes UPDATEs that omit unchanged TOASTed values from the
# archive's own previous image of the row; "require-full" refuses tables that are not REPLICA IDENTITY FULL.
UNCHANGED_TOAST_POLICIES = ("fill", "require-full")
DESTINATION_KEYS = {"local": {"type", "path"},
                    "s3": {"type", "bucket", "prefix", "region", "endpoint_url", "path_style", "credentials",
                           "connect_timeout", "read_timeout", "max_attempts", "multipart_threshold"}}
DESTINATION_REQUIRED = {"local": ("path",), "s3": ("bucket",)}
# The keys of `buffer { s3 { } }`: an s3 destination's, minus what the root's URI says (bucket, prefix).
S3_CONNECTION_KEYS = DESTINATION_KEYS["s3"] - {"type", "bucket", "prefix"}
EVENT_KEYS = {"sns": ("topic_arn",), "sqs": ("queue_url",), "kinesis": ("stream",), "file": ("path",)}
EVENT_COMMON = {"type", "region", "endpoint_url", "credentials"}
TABLE_KEYS = ("source", "key_prefix", "key_fields", "diff", "snapshot", "retention", "destinations",
              "formats", "events", "buffer", "retry", "state")


def _source(s: _Section) -> SourceConfig:
    dsn = s.tree.get("dsn", None)
    if isinstance(dsn, str):
        register_dsn(dsn)  # first: any error about this section must already redact its password
    kind = s.string("type", "laredo", choices=SOURCE_TYPES)
    src = SourceConfig(
        type=kind,
        schema=s.string("schema", "public"),
        table=s.string("table", required=True),
        server=s.string("server", required=kind == "laredo"),
        client_id=s.string("client_id"),
        local_snapshot_path=s.string("local_snapshot_path"),
        protocol=s.string("protocol", "connect", choices=("connect", "grpc")),
        dsn=s.string("dsn", required=kind == "postgres"),
        slot=s.string("slot"),
        publication=s.string("publication"),
        create_slot=s.get("create_slot", parse_bool, True),
        recreate_slot_on_loss=s.get("recreate_slot_on_loss", parse_bool, False),
        unchanged_toast=s.string("unchanged_toast", "fill", choices=UNCHANGED_TOAST_POLICIES),
        generator=s.sub("generator").plain() if s.has("generator") else {},
        tls=_tls(s.sub("tls")) if s.has("tls") else None,
    )
    if src.tls is not None and kind != "laredo":
        raise ConfigError(s.file, s.at("tls"), f"TLS settings apply to a laredo source, not a {kind} source")
    s.done()
    if src.dsn:
        problem = dsn_problem(src.dsn)
        if problem:
            raise ConfigError(s.file, s.at("dsn"), problem)
    return src


def _tls(s: _Section) -> ClientTls:
    """`source.tls { ca_file, cert_file, key_file, server_name }`; the files are read when the source
    connects (the host that loads the configuration may not be the one that runs the source)."""
    values = {key: s.string(key) for key in ClientTls.KEYS}
    s.done()
    try:
        return ClientTls(**values)
    except TlsError as exc:
        raise ConfigError(s.file, s.path, str(exc)) from None


def _policy(s: _Section, diff_interval: _dt.timedelta) -> Policy:
    zero = _dt.timedelta(0)
    p = Policy(
        diff_interval=diff_interval,
        min_interval=s.get("min_interval", parse_duration, zero),
        max_interval=s.get("max_interval", parse_duration, zero),
        max_diff_bytes=s.get("max_diff_bytes", parse_size, 0),
        max_diff_fraction=s.get("max_diff_fraction", parse_fraction, 0.0),
        max_churn_records=s.get("max_churn_records", parse_count, 0),
        max_churn_fraction=s.get("max_churn_fraction", parse_fraction, 0.0),
    )
    s.done()
    return p


def _destination(s: _Section, credentials: Mapping[str, CredentialProfile]) -> dict[str, Any]:
    kind = s.string("type", required=True, choices=tuple(DESTINATION_KEYS))
    spec = s.plain()
    unknown = sorted(set(spec) - DESTINATION_KEYS[kind])
    if unknown:
        raise ConfigError(s.file, s.at(unknown[0]), f"unknown key {unknown[0]!r} for a {kind} destination")
    for key in DESTINATION_REQUIRED[kind]:
        if not spec.get(key):
            raise ConfigError(s.file, s.at(key), f"is required for a {kind} destination")
    if kind == "local":
        spec["path"] = os.path.abspath(str(spec["path"]))
    return _typed_s3_keys(s, spec, credentials)


def _typed_s3_keys(s: _Section, spec: dict[str, Any], credentials: Mapping[str, CredentialProfile]) -> dict[str, Any]:
    """`spec` with its S3 connection keys parsed (booleans, durations, counts, sizes) and its profile checked."""
    if "path_style" in spec:
        spec["path_style"] = s.get("path_style", parse_bool, False)
    for key, parse in (("connect_timeout", parse_duration), ("read_timeout", parse_duration),
                       ("max_attempts", parse_count), ("multipart_threshold", parse_size)):
        if key in spec:
            value = s.get(key, parse, None)
            spec[key] = value.total_seconds() if isinstance(value, _dt.timedelta) else value
    _check_profile(s, spec, credentials)
    return spec


def _event(s: _Section, credentials: Mapping[str, CredentialProfile]) -> dict[str, Any]:
    kind = s.string("type", required=True, choices=tuple(EVENT_KEYS))
    spec = s.plain()
    unknown = sorted(set(spec) - EVENT_COMMON - set(EVENT_KEYS[kind]))
    if unknown:
        raise ConfigError(s.file, s.at(unknown[0]), f"unknown key {unknown[0]!r} for a {kind} sink")
    for key in EVENT_KEYS[kind]:
        if not spec.get(key):
            raise ConfigError(s.file, s.at(key), f"is required for a {kind} sink")
    _check_profile(s, spec, credentials)
    return spec


def _check_profile(s: _Section, spec: Mapping[str, Any], credentials: Mapping[str, CredentialProfile]) -> None:
    name = spec.get("credentials")
    if name and name not in credentials:
        known = ", ".join(sorted(credentials)) or "none defined"
        raise ConfigError(s.file, s.at("credentials"), f"unknown credentials profile {name!r} ({known})")


def _formats(s: _Section, key: str) -> tuple[str, ...]:
    values = s.strings(key, ("jsonl",))
    for v in values:
        if v not in FORMATS:
            raise ConfigError(s.file, s.at(key), f"unknown format {v!r}; expected one of {', '.join(sorted(FORMATS))}")
    if not values:
        raise ConfigError(s.file, s.at(key), "lists no format")
    return values


def _buffer(s: _Section, default: BufferConfig, credentials: Mapping[str, CredentialProfile]) -> BufferConfig:
    path = s.string("path", default.path)
    if not is_s3_uri(path):
        path = os.path.abspath(path)  # Spark's executors may not share our cwd
    elif not urlsplit(path).netloc:
        raise ConfigError(s.file, s.at("path"), f"{path!r} names no bucket (s3://bucket/prefix)")
    s3 = dict(default.s3)
    if s.has("s3"):
        if not is_s3_uri(path):
            raise ConfigError(s.file, s.at("s3"), "connection settings for a local path (path is not s3://...)")
        s3 = _s3_connection(s.sub("s3"), credentials)
    b = BufferConfig(
        path=path,
        seal_interval=s.get("seal_interval", parse_duration, default.seal_interval),
        seal_changes=s.get("seal_changes", parse_count, default.seal_changes),
        s3=s3,
        lease=s.get("lease", parse_duration, default.lease),
    )
    s.done()
    if b.lease < _dt.timedelta(seconds=3):
        raise ConfigError(s.file, s.at("lease"), "must be at least 3s (it is renewed every third of it)")
    return b


def _s3_connection(s: _Section, credentials: Mapping[str, CredentialProfile]) -> dict[str, Any]:
    """An S3 working root's connection keys, checked and typed as a destination's."""
    spec = s.plain()
    unknown = sorted(set(spec) - S3_CONNECTION_KEYS)
    if unknown:
        raise ConfigError(s.file, s.at(unknown[0]), f"unknown key {unknown[0]!r} for an s3 connection "
                          f"(known: {', '.join(sorted(S3_CONNECTION_KEYS))})")
    return _typed_s3_keys(s, spec, credentials)


def _key_fields(s: _Section) -> tuple[str, ...]:
    """The configured key fields; `()` when unset (the source's key), never an explicit empty list."""
    fields = s.strings("key_fields", ())
    if s.has("key_fields") and not fields:
        raise ConfigError(s.file, s.at("key_fields"), "lists no field (leave it out to use the source's key)")
    return fields


def _retry(s: _Section) -> RetryConfig:
    default = RetryConfig()
    r = RetryConfig(backoff=s.get("backoff", parse_duration, default.backoff),
                    max_backoff=s.get("max_backoff", parse_duration, default.max_backoff))
    s.done()
    if r.backoff <= _dt.timedelta(0):
        raise ConfigError(s.file, s.at("backoff"), "must be greater than 0")
    if r.max_backoff < r.backoff:
        raise ConfigError(s.file, s.at("max_backoff"), f"must be at least retry.backoff ({r.backoff})")
    return r


def _table(s: _Section, credentials: Mapping[str, CredentialProfile], buffer: BufferConfig) -> TableConfig:
    source = _source(s.sub("source"))
    diff = s.sub("diff")
    diff_interval = diff.get("interval", parse_duration, _dt.timedelta(seconds=30))
    diff.done()
    if diff_interval <= _dt.timedelta(0):
        raise ConfigError(s.file, diff.at("interval"), "must be greater than 0")
    policy = _policy(s.sub("snapshot"), diff_interval)
    retention = s.sub("retention")
    keep_epochs = retention.get("keep_epochs", parse_count, 0)
    grace = retention.get("grace", parse_duration, DEFAULT_GRACE)
    retention.done()
    formats = s.sub("formats")
    snapshot_formats, diff_formats = _formats(formats, "snapshot"), _formats(formats, "diff")
    formats.done()
    destinations = tuple(_destination(d, credentials) for d in s.items("destinations"))
    if not destinations:
        raise ConfigError(s.file, s.at("destinations"), "at least one destination is required")
    key_prefix = s.string("key_prefix", default_key_prefix(source.table))
    table = TableConfig(
        source=source,
        key_prefix=key_prefix,
        key_fields=_key_fields(s),
        diff_interval=diff_interval,
        policy=policy,
        keep_epochs=keep_epochs,
        destinations=destinations,
        snapshot_formats=snapshot_formats,
        diff_formats=diff_formats,
        events=tuple(_event(e, credentials) for e in s.items("events")),
        buffer=_buffer(s.sub("buffer"), buffer, credentials) if s.has("buffer") else buffer,
        credentials=credentials,
        retry=_retry(s.sub("retry")),
        bucket_bytes=_bucket_bytes(s.sub("state")),
        retention_grace=grace,
    )
    return table


def _bucket_bytes(s: _Section) -> int:
    size = s.get("bucket_size", parse_size, DEFAULT_BUCKET_BYTES)
    s.done()
    if size < MIN_BUCKET_BYTES:
        raise ConfigError(s.file, s.at("bucket_size"), f"must be at least {MIN_BUCKET_BYTES // (1024 * 1024)} MiB "
                          "(a bucket's bytes are one S3 multipart part, which must be at least 5 MiB)")
    return size


def _capture(s: _Section, credentials: Mapping[str, CredentialProfile]) -> CaptureSettings:
    """`capture { port, buffer { }, page { }, storage { }, index { } }` (resources/capture/settings.py)."""
    d = CaptureSettings()
    b, p, st, ix = s.sub("buffer"), s.sub("page"), s.sub("storage"), s.sub("index")
    buffer = BufferSettings(
        path=os.path.abspath(b.string("path", d.buffer.path)),
        max_events=b.get("max_events", parse_count, d.buffer.max_events),
        max_size_bytes=b.get("max_size_bytes", parse_size, d.buffer.max_size_bytes),
        max_age_seconds=b.get("max_age_seconds", parse_duration,
                              _dt.timedelta(seconds=d.buffer.max_age_seconds)).total_seconds(),
        flush_on_disconnect=b.get("flush_on_disconnect", parse_bool, d.buffer.flush_on_disconnect),
        max_payload_bytes=b.get("max_payload_bytes", parse_size, d.buffer.max_payload_bytes))
    for key, value in (("max_events", buffer.max_events), ("max_size_bytes", buffer.max_size_bytes),
                       ("max_age_seconds", buffer.max_age_seconds), ("max_payload_bytes", buffer.max_payload_bytes)):
        if value <= 0:
            raise ConfigError(s.file, b.at(key), "must be greater than 0")
    page = PageSettings(format=p.string("format", d.page.format, choices=PAGE_FORMATS),
                        compression=p.string("compression", d.page.compression, choices=COMPRESSIONS),
                        target_size_mb=p.get("target_size_mb", parse_fraction, d.page.target_size_mb),
                        include_metadata=p.get("include_metadata", parse_bool, d.page.include_metadata),
                        tags={k: str(v) for k, v in p.sub("tags").plain().items()})
    if page.target_size_mb <= 0:
        raise ConfigError(s.file, p.at("target_size_mb"), "must be greater than 0")
    if not st.has("destination"):
        raise ConfigError(s.file, st.at("destination"), "is required (where pages are written)")
    storage = StorageSettings(
        destination=_destination(st.sub("destination"), credentials),
        key_template=st.string("key_template", d.storage.key_template),
        retry_backoff=st.get("retry_backoff", parse_duration,
                             _dt.timedelta(seconds=d.storage.retry_backoff)).total_seconds(),
        retry_for=st.get("retry_for", parse_duration, _dt.timedelta(seconds=d.storage.retry_for)).total_seconds(),
        dead_letter=os.path.abspath(st.string("dead_letter")) if st.has("dead_letter") else "")
    try:
        check_template(storage.key_template)
    except KeyTemplateError as e:
        raise ConfigError(s.file, st.at("key_template"), str(e)) from None
    index = IndexSettings(backend=ix.string("backend", d.index.backend, choices=INDEX_BACKENDS),
                          dsn=ix.string("dsn"), table=ix.string("table", d.index.table),
                          retry_backoff=ix.get("retry_backoff", parse_duration,
                                               _dt.timedelta(seconds=d.index.retry_backoff)).total_seconds())
    if index.backend != "none" and not index.dsn:
        raise ConfigError(s.file, ix.at("dsn"), f"is required for a {index.backend} index")
    if not index.table.replace("_", "").isalnum():
        raise ConfigError(s.file, ix.at("table"), f"{index.table!r} is not a plain table name")
    if index.backend == "postgres":
        register_dsn(index.dsn)
    port = s.get("port", parse_count, d.port)
    for section in (b, p, st, ix, s):
        section.done()
    return CaptureSettings(buffer=buffer, page=page, storage=storage, index=index, port=port)


def _credentials(s: _Section) -> dict[str, CredentialProfile]:
    out: dict[str, CredentialProfile] = {}
    for name in list(s.tree.keys()):
        c = s.sub(name)
        kind = c.string("type", "ambient", choices=("ambient", "assume_role"))
        profile = CredentialProfile(
            name=name, type=kind, region=c.string("region"),
            role_arn=c.string("role_arn", required=kind == "assume_role"),
            external_id=c.string("external_id"), session_name=c.string("session_name"), base=c.string("base"),
            endpoint_url=c.string("endpoint_url"),
        )
        c.done()
        out[name] = profile
    for p in out.values():
        if p.base and p.base not in out:
            raise ConfigError(s.file, f"{s.at(p.name)}.base", f"unknown credentials profile {p.base!r}")
    return out


_ENV_KEY = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")


def _apply_env_overrides(tree: ConfigTree, env: Mapping[str, str]) -> None:
    """`SNAPSHOTTER__TABLES__0__DIFF__INTERVAL=5s` sets snapshotter.tables[0].diff.interval."""
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        node: Any = tree["snapshotter"]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            where = ".".join(["snapshotter", *parts[:i]])
            if not _ENV_KEY.fullmatch(part):
                raise ConfigError(f"${name}", where, f"{part!r} is not a key (letters, digits, single underscores)")
            if not isinstance(node, (list, ConfigTree)):
                raise ConfigError(f"${name}", where, "is a value, not an object or a list to set a key in")
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"${name}", ".".join(parts[: i + 1]), f"no list element {part!r}")
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
            elif last:
                node[part] = value
            else:
                if part not in node:
                    node[part] = ConfigTree()
                node = node[part]


def parse_config(text: str, *, file: str = "<string>", env: Mapping[str, str] | None = None) -> SnapshotterConfig:
    """Parse and validate a configuration document."""
    return _from_tree(_parse(lambda: ConfigFactory.parse_string(text, resolve=True), file), file, env)


def _parse(parse: Callable[[], ConfigTree], file: str) -> ConfigTree:
    try:
        return parse()
    except ParseBaseException as e:
        # pyparsing's own message quotes the text it found there, which may be a secret (a DSN
        # on that line, the contents of an included key file) and its grammar: the place is enough.
        raise ConfigError(file, "", f"not valid HOCON: syntax error at line {e.lineno}, column {e.col} "
                                    "(of the file or of a file it includes)") from None
    except (ConfigException, Exception) as e:  # substitutions, includes, pyhocon's own checks
        raise ConfigError(file, "", f"not valid HOCON: {e}") from None


def _from_tree(tree: ConfigTree, file: str, env: Mapping[str, str] | None) -> SnapshotterConfig:
    if "snapshotter" not in tree:
        raise ConfigError(file, "", 'missing the top-level "snapshotter" object')
    _apply_env_overrides(tree, os.environ if env is None else env)
    root = _Section(tree["snapshotter"], "snapshotter", file)
    credentials = _credentials(root.sub("credentials"))
    http = root.sub("http")
    http_port = http.get("port", parse_count, 8080)
    http.done()
    spark_s = root.sub("spark")
    spark = SparkConfig(remote=spark_s.string("remote"), master=spark_s.string("master"),
                        conf={k: str(v) for k, v in spark_s.sub("conf").plain().items()},
                        local_server_idle_timeout=spark_s.get("local_server_idle_timeout", parse_duration,
                                                              SparkConfig.local_server_idle_timeout))
    spark_s.done()
    buffer = _buffer(root.sub("buffer") if root.has("buffer") else _Section({}, "", file), BufferConfig(), credentials)
    capture = _capture(root.sub("capture"), credentials) if root.has("capture") else None
    if root.has("tables"):
        stray = [k for k in TABLE_KEYS if k != "buffer" and root.has(k)]
        if stray:
            raise ConfigError(file, root.at(stray[0]), "is a table key; with tables = [...] put it inside each table")
        tables = tuple(_table_done(t, credentials, buffer) for t in root.items("tables"))
    elif root.has("source"):
        tables = (_table(root, credentials, buffer),)
    elif capture is not None:
        tables = ()  # an event capture service alone archives no table
    else:
        raise ConfigError(file, "snapshotter", "no tables configured (set snapshotter.tables or snapshotter.source)")
    groups = _groups(root, tables) if root.has("groups") else ()
    root.done()
    if not tables and capture is None:
        raise ConfigError(file, "snapshotter.tables", "is empty")
    names = [t.name for t in tables]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(file, "snapshotter.tables", f"table {dupes[0]} is configured twice")
    members = {t: g.name for g in groups for t in g.tables}
    tables = tuple(replace(t, group=members.get(t.name, "")) for t in tables)
    return SnapshotterConfig(file=file, tables=tables, credentials=credentials, http_port=http_port, spark=spark,
                             capture=capture, groups=groups)


def _groups(root: _Section, tables: tuple[TableConfig, ...]) -> tuple[GroupConfig, ...]:
    """`groups = [ { name, tables = [...], key_prefix?, diff { interval }? } ]`, checked against the tables:
    every member configured, of one PostgreSQL database (one DSN), in one group only, listed once."""
    by_name = {t.name: t for t in tables}
    owner: dict[str, str] = {}
    groups: list[GroupConfig] = []
    for g in root.items("groups"):
        name = g.string("name", required=True)
        if not GROUP_NAME.match(name):
            raise ConfigError(g.file, g.at("name"), f"{name!r} is not a group name (letters, digits, '_', '.', "
                                                    "'-'; at most 63)")
        if any(other.name == name for other in groups):
            raise ConfigError(g.file, g.at("name"), f"group {name!r} is configured twice")
        members = g.strings("tables", ())
        if not members:
            raise ConfigError(g.file, g.at("tables"), "lists no table")
        chosen: list[TableConfig] = []
        for member in members:
            table = by_name.get(member) or next((t for t in tables if t.source.table == member), None)
            if table is None:
                raise ConfigError(g.file, g.at("tables"), f"unknown table {member!r}; configured: "
                                  f"{', '.join(by_name)}")
            if table in chosen:
                raise ConfigError(g.file, g.at("tables"), f"table {table.name} is listed twice")
            if table.name in owner:
                raise ConfigError(g.file, g.at("tables"), f"table {table.name} is already in group "
                                  f"{owner[table.name]!r}; a table belongs to at most one group")
            if table.source.type != "postgres":
                raise ConfigError(g.file, g.at("tables"), f"table {table.name} has a {table.source.type} source; "
                                  "a group's members are tables of one PostgreSQL database (type = postgres)")
            if chosen and database_of(table.source.dsn) != database_of(chosen[0].source.dsn):
                raise ConfigError(g.file, g.at("tables"), f"tables {chosen[0].name} and {table.name} come from "
                                  "different sources (source.dsn names another host, port or database); a "
                                  "group's positions must be of one database")
            chosen.append(table)
            owner[table.name] = name
        diff = g.sub("diff")
        interval = diff.get("interval", parse_duration, min(t.diff_interval for t in chosen))
        diff.done()
        if interval <= _dt.timedelta(0):
            raise ConfigError(g.file, diff.at("interval"), "must be greater than 0")
        prefix = g.string("key_prefix", default_group_prefix(name))
        if not prefix.endswith("/") or prefix in {t.key_prefix for t in tables}:
            raise ConfigError(g.file, g.at("key_prefix"), f"{prefix!r} must end in '/' and be no table's key_prefix")
        g.done()
        groups.append(GroupConfig(name, tuple(t.name for t in chosen), prefix, interval))
    return tuple(groups)


def database_of(dsn: str) -> tuple[str, ...]:
    """The database a PostgreSQL DSN names, as (host, port, dbname) with libpq's defaults filled in, so
    two spellings of one database (a URI and key=value, different parameter order, an explicit default
    port, other credentials) compare equal. A DSN libpq cannot parse compares as its text."""
    import psycopg2.extensions

    try:
        parts = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return (dsn,)
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    return host, parts.get("port") or "5432", parts.get("dbname") or parts.get("user") or ""


def _table_done(s: _Section, credentials: Mapping[str, CredentialProfile], buffer: BufferConfig) -> TableConfig:
    table = _table(s, credentials, buffer)
    s.done()
    return table


def load_config(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> SnapshotterConfig:
    """Load the configuration from `path`, `$SNAPSHOTTER_CONFIG`, or the shipped demo config."""
    environ = os.environ if env is None else env
    chosen = Path(path or environ.get("SNAPSHOTTER_CONFIG") or DEFAULT_CONFIG)
    if not chosen.is_file():
        raise ConfigError(str(chosen), "", "cannot read the configuration (no such file)")
    # parse_file resolves HOCON includes relative to the file itself.
    tree = _parse(lambda: ConfigFactory.parse_file(str(chosen), resolve=True), str(chosen))
    return _from_tree(tree, str(chosen), environ)
