"""Configuration: laredo's files load unchanged; every bad value fails naming file, key and value."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from snapshot_assets.config import ConfigError, load_config, parse_config

# The shape of laredo-snapshotter's full example (single-table form), in our own words.
LAREDO_FULL = """
snapshotter {
  source {
    server = "laredo-server:4001"
    schema = public
    table = config_document
    client_id = snapshotter-config-1
    local_snapshot_path = "/var/lib/laredo/cache.json"
  }
  diff { interval = 30s }
  snapshot {
    min_interval = 5m
    max_interval = 6h
    max_diff_bytes = 33554432
    max_diff_fraction = 0.25
    max_churn_records = 100000
    max_churn_fraction = 0.5
  }
  destinations = [
    { type = s3, bucket = archive-bucket, prefix = "config_document/", region = us-east-1, credentials = s3_writer },
    { type = local, path = "/var/lib/laredo/archive" }
  ]
  formats { snapshot = [ jsonl, protobuf ], diff = [ protobuf ] }
  events = [
    { type = sns, topic_arn = "arn:aws:sns:us-east-1:111122223333:t", credentials = events_pub },
    { type = kinesis, stream = s1, region = us-east-1, credentials = events_pub }
  ]
  credentials {
    s3_writer { type = ambient }
    events_pub { type = assume_role, role_arn = "arn:aws:iam::444455556666:role/pub", external_id = x,
                 session_name = y, base = s3_writer }
  }
  http { port = 8080 }
  retention { keep_epochs = 2 }
}
"""

LAREDO_TABLES = """
snapshotter {
  tables = [
    { source { server = "localhost:4001", schema = public, table = a }
      destinations = [ { type = local, path = "./arch" } ] }
    { source { server = "localhost:4001", schema = sales, table = b }
      key_fields = [tenant, id], key_prefix = "bees/"
      diff.interval = 10s
      destinations = [ { type = local, path = "./arch" } ] }
  ]
}
"""


def test_laredo_single_table_form() -> None:
    cfg = parse_config(LAREDO_FULL, env={})
    (t,) = cfg.tables
    assert t.name == "public.config_document" and t.key_prefix == "config_document/"
    # key_fields unset is recorded as unset: the source's key (laredo's [id] when it reports none).
    assert t.diff_interval == dt.timedelta(seconds=30) and t.key_fields == ()
    p = t.policy
    assert (p.min_interval, p.max_interval) == (dt.timedelta(minutes=5), dt.timedelta(hours=6))
    assert (p.max_diff_bytes, p.max_diff_fraction, p.max_churn_records, p.max_churn_fraction) == (
        33554432, 0.25, 100000, 0.5)
    assert t.snapshot_formats == ("jsonl", "protobuf") and t.diff_formats == ("protobuf",)
    assert [d["type"] for d in t.destinations] == ["s3", "local"] and t.keep_epochs == 2
    assert [e["type"] for e in t.events] == ["sns", "kinesis"]
    assert cfg.credentials["events_pub"].role_arn.endswith("role/pub") and cfg.http_port == 8080
    assert t.source.type == "laredo" and t.source.client_id == "snapshotter-config-1"


def test_laredo_tables_form_and_defaults() -> None:
    cfg = parse_config(LAREDO_TABLES, env={})
    a, b = cfg.tables
    assert a.key_prefix == "a/" and a.diff_interval == dt.timedelta(seconds=30)
    assert a.snapshot_formats == ("jsonl",) and a.policy.max_interval == dt.timedelta(0)
    assert b.key_fields == ("tenant", "id") and b.key_prefix == "bees/" and b.name == "sales.b"
    assert cfg.table("b") is b and cfg.table("public.a") is a


def test_project_additions() -> None:
    cfg = parse_config("""
    snapshotter {
      source { type = postgres, dsn = "postgresql://u@localhost/db", table = users, slot = s1, publication = p1 }
      snapshot { max_diff_bytes = 32MiB, max_interval = 1h30m, max_churn_fraction = "25%" }
      destinations = [ { type = s3, bucket = b, endpoint_url = "http://127.0.0.1:9000", path_style = true } ]
      formats { snapshot = [parquet, jsonl], diff = [parquet] }
      buffer { path = /var/buf, seal_interval = 250ms, seal_changes = 500 }
      spark { remote = "sc://localhost:15002", conf { "spark.sql.shuffle.partitions" = 4 } }
    }""", env={})
    t = cfg.tables[0]
    assert t.source.dsn.startswith("postgresql://") and t.source.schema == "public"
    assert t.policy.max_diff_bytes == 32 * 1024 * 1024 and t.policy.max_interval == dt.timedelta(minutes=90)
    assert t.policy.max_churn_fraction == 0.25 and t.destinations[0]["path_style"] is True
    assert t.buffer.seal_interval == dt.timedelta(milliseconds=250) and t.buffer.seal_changes == 500
    assert cfg.spark.remote == "sc://localhost:15002" and cfg.spark.conf == {"spark.sql.shuffle.partitions": "4"}


def test_local_spark_server_idle_timeout() -> None:
    """Default 15 minutes; any duration; 0 keeps the server until it is stopped."""
    assert parse_config(BASE.format(""), env={}).spark.local_server_idle_timeout == dt.timedelta(minutes=15)
    for text, expected in (("90s", dt.timedelta(seconds=90)), ("1h", dt.timedelta(hours=1)), ("0", dt.timedelta(0))):
        cfg = parse_config(BASE.format(f"spark {{ local_server_idle_timeout = {text} }}"), env={})
        assert cfg.spark.local_server_idle_timeout == expected


def test_environment_overrides() -> None:
    cfg = parse_config(LAREDO_TABLES, env={"SNAPSHOTTER__TABLES__1__DIFF__INTERVAL": "5s",
                                           "SNAPSHOTTER__HTTP__PORT": "9090"})
    assert cfg.tables[1].diff_interval == dt.timedelta(seconds=5) and cfg.http_port == 9090
    with pytest.raises(ConfigError, match="no list element '7'"):
        parse_config(LAREDO_TABLES, env={"SNAPSHOTTER__TABLES__7__DIFF__INTERVAL": "5s"})


def test_hocon_optional_substitution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARCHIVE_DIR", "/srv/archive")
    cfg = parse_config("""snapshotter { source { server = s, table = t }
      destinations = [ { type = local, path = /default, path = ${?ARCHIVE_DIR} } ] }""", env={})
    assert cfg.tables[0].destinations[0]["path"] == "/srv/archive"


BASE = 'snapshotter {{ source {{ server = s, table = t }}, destinations = [ {{ type = local, path = /x }} ]\n{}\n}}'


@pytest.mark.parametrize(
    ("extra", "path", "message"),
    [
        ("diff.interval = 5 parsecs", "snapshotter.diff.interval", "unknown unit 'parsecs'"),
        ("diff.interval = 0s", "snapshotter.diff.interval", "greater than 0"),
        ("snapshot.max_diff_bytes = 32 lightyears", "snapshotter.snapshot.max_diff_bytes", "cannot parse size"),
        ("snapshot.max_diff_fraction = -0.5", "snapshotter.snapshot.max_diff_fraction", "must be a finite number >= 0"),
        ("snapshot.max_churn_records = many", "snapshotter.snapshot.max_churn_records", "expected a number"),
        ("snapshot.max_intervall = 5m", "snapshotter.snapshot.max_intervall", "unknown key 'max_intervall'"),
        ("formats.snapshot = [csv]", "snapshotter.formats.snapshot", "unknown format 'csv'"),
        ("bogus = 1", "snapshotter.bogus", "unknown key 'bogus'"),
        ("events = [ { type = email } ]", "snapshotter.events[0].type", "unknown value 'email'"),
        ("events = [ { type = sqs } ]", "snapshotter.events[0].queue_url", "is required for a sqs sink"),
        ("events = [ { type = sns, topic_arn = a, credentials = nope } ]", "snapshotter.events[0].credentials",
         "unknown credentials profile 'nope'"),
        ("credentials { r { type = assume_role } }", "snapshotter.credentials.r.role_arn", "is required"),
        ("credentials { r { type = magic } }", "snapshotter.credentials.r.type", "unknown value 'magic'"),
        ("retention.keep_epochs = -1", "snapshotter.retention.keep_epochs", "non-negative integer"),
        ("key_fields = []", "snapshotter.key_fields", "lists no field (leave it out to use the source's key)"),
        ("source.unchanged_toast = mark", "snapshotter.source.unchanged_toast", "unknown value 'mark'"),
        ("source.tls { ca = x }", "snapshotter.source.tls.ca", "unknown key 'ca'"),
        ("source.tls { cert_file = c }", "snapshotter.source.tls", "cert_file and key_file go together"),
        ("source.tls { server_name = [a] }", "snapshotter.source.tls.server_name", "expected a string"),
        ("buffer { path = /b, s3 { region = x } }", "snapshotter.buffer.s3",
         "connection settings for a local path"),
        ('buffer { path = "s3://b/p", s3 { endpoint = x } }', "snapshotter.buffer.s3.endpoint",
         "unknown key 'endpoint' for an s3 connection"),
        ('buffer { path = "s3://b/p", s3 { credentials = nope } }', "snapshotter.buffer.s3.credentials",
         "unknown credentials profile 'nope'"),
        ('buffer { path = "s3:///p" }', "snapshotter.buffer.path", "names no bucket"),
        ("buffer { lease = 1s }", "snapshotter.buffer.lease", "must be at least 3s"),
        ("source { type = generator, tls { ca_file = x } }", "snapshotter.source.tls",
         "TLS settings apply to a laredo source, not a generator source"),
        ("spark.local_server_idle_timeout = -5m", "snapshotter.spark.local_server_idle_timeout",
         "cannot parse duration '-5m'"),
        ("spark.local_server_idle_timeout = soon", "snapshotter.spark.local_server_idle_timeout",
         "cannot parse duration"),
    ],
)
def test_bad_values_name_file_key_and_value(extra: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(BASE.format(extra), file="snap.conf", env={})
    text = str(err.value)
    assert text.startswith(f"snap.conf: {path}: "), text
    assert message in text


def test_an_s3_working_root_keeps_its_uri_and_typed_connection_keys() -> None:
    """`buffer.path = "s3://..."`: nothing of the pipeline's state needs a disk that hosts share."""
    extra = ('buffer { path = "s3://work-bucket/snap", lease = 20s, s3 { endpoint_url = "http://127.0.0.1:9000", '
             "path_style = true, read_timeout = 5s, region = eu-west-1 } }")
    table = parse_config(BASE.format(extra), env={}).tables[0]
    assert table.buffer.path == "s3://work-bucket/snap"
    assert dict(table.buffer.s3) == {"endpoint_url": "http://127.0.0.1:9000", "path_style": True,
                                     "read_timeout": 5.0, "region": "eu-west-1"}
    assert table.buffer.lease == dt.timedelta(seconds=20)
    local = parse_config(BASE.format("buffer.path = rel/buf"), env={}).tables[0]
    assert Path(local.buffer.path).is_absolute() and dict(local.buffer.s3) == {}


def test_unchanged_toast_defaults_to_fill() -> None:
    """Tables as users have them (REPLICA IDENTITY DEFAULT) are archived without asking for FULL."""
    table = parse_config(BASE.format(""), env={}).tables[0]
    assert table.source.unchanged_toast == "fill"
    strict = parse_config(BASE.format("source.unchanged_toast = require-full"), env={}).tables[0]
    assert strict.source.unchanged_toast == "require-full"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("snapshotter { source { server = s, table = t } }", "at least one destination is required"),
        ("snapshotter { source { table = t }, destinations = [ { type = local, path = x } ] }",
         "snapshotter.source.server: is required"),
        ("snapshotter { source { type = kafka, table = t } }", "unknown value 'kafka'"),
        ("snapshotter { destinations = [] }", "no tables configured"),
        ("other {}", 'missing the top-level "snapshotter" object'),
        ("snapshotter { source {", "not valid HOCON"),
        ("snapshotter { tables = [], diff.interval = 5s }", "is a table key"),
        ("snapshotter { destinations = [ { type = ftp } ], source { server = s, table = t } }", "unknown value 'ftp'"),
        ("snapshotter { destinations = [ { type = s3 } ], source { server = s, table = t } }",
         "bucket: is required for a s3 destination"),
    ],
)
def test_structural_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        parse_config(text, env={})


def test_load_from_env_file_and_default(tmp_path: Path) -> None:
    conf = tmp_path / "x.conf"
    conf.write_text(LAREDO_TABLES)
    assert len(load_config(env={"SNAPSHOTTER_CONFIG": str(conf)}).tables) == 2
    assert load_config(env={}).tables[0].source.type == "generator"  # the shipped demo config
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.conf", env={})

