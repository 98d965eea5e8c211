"""Fuzz configuration loading: the HOCON file and SNAPSHOTTER__ environment overrides.

Valid configurations (single-table and `tables = [...]` forms, every source type, destinations,
events, credentials) are rendered as HOCON and mutated as bytes (decoded leniently, as a file of
any bytes would be) and as overrides; `parse_config` returns a configuration or raises ConfigError.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from snapshot_assets.config import ConfigError, parse_config
from tests.fuzz.support import fuzz_settings, guarded, inputs

words = st.text(st.sampled_from("abcxyz_09"), min_size=1, max_size=6)
durations = st.sampled_from(["5s", "1m", "0s", "250ms", "2h", "-1s", "1x", "99999999999d"])
sizes = st.sampled_from(["1MiB", "10 MB", "0", "12", "1.5GB", "-3KB", "9" * 30])


@st.composite
def configs(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["generator", "postgres", "laredo"]))
    source = {"generator": "generator { seed = 1, rows = 3 }",
              "postgres": 'dsn = "host=127.0.0.1 port=5 user=u password=pw dbname=d"',
              "laredo": 'server = "http://127.0.0.1:4002"'}[kind]
    table = f"""
      source {{ type = {kind}, schema = public, table = {draw(words)}, {source} }}
      key_fields = [id]
      diff.interval = {draw(durations)}
      snapshot {{ min_interval = {draw(durations)}, max_diff_bytes = {draw(sizes)},
                  max_churn_fraction = {draw(st.sampled_from(["0.5", "2", "x"]))} }}
      retention.keep_epochs = {draw(st.integers(-1, 5))}
      destinations = [ {{ type = local, path = "/tmp/a" }},
                       {{ type = s3, bucket = b, prefix = "p/", credentials = writer, path_style = true }} ]
      formats {{ snapshot = [jsonl, protobuf], diff = [parquet] }}
      events = [ {{ type = sqs, queue_url = "http://q", credentials = writer }} ]
    """
    body = f"tables = [ {{ {table} }} ]" if draw(st.booleans()) else table
    text = f"""snapshotter {{
      credentials {{ writer {{ type = assume_role, role_arn = "arn:aws:iam::1:role/w" }} }}
      http.port = {draw(st.integers(0, 70000))}
      buffer {{ path = "/tmp/b", seal_interval = {draw(durations)} }}
      {body}
    }}"""
    return text.encode()


overrides = st.dictionaries(
    st.builds(lambda parts: "SNAPSHOTTER__" + "__".join(parts),
              st.lists(st.sampled_from(["SOURCE", "TABLE", "TABLES", "0", "1", "DIFF", "INTERVAL", "KEY_FIELDS",
                                        "DESTINATIONS", "PATH", "X", ""]), min_size=1, max_size=4)),
    st.text(max_size=6), max_size=3)


def _parse(data: bytes, env: dict[str, str]) -> None:
    parse_config(data.decode("utf-8", "replace"), file="fuzz.conf", env=env)


@fuzz_settings(80)
@given(inputs(configs()), overrides)
def test_configs_load_or_fail_cleanly(data: bytes, env: dict[str, str]) -> None:
    guarded(lambda: _parse(data, env), (ConfigError,))


@fuzz_settings(50)
@given(configs(), overrides)
def test_environment_overrides_load_or_fail_cleanly(data: bytes, env: dict[str, str]) -> None:
    guarded(lambda: _parse(data, env), (ConfigError,))


def test_an_override_below_a_plain_value_is_a_config_error() -> None:
    text = 'snapshotter { source { type = generator, table = t }, destinations = [{ type = local, path = "/a" }] }'
    error = guarded(lambda: parse_config(text, env={"SNAPSHOTTER__SOURCE__TABLE__X": "1"}), (ConfigError,))
    assert error is not None and "snapshotter.source.table" in str(error), error
