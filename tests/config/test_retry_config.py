"""`retry { backoff, max_backoff }`: per table, checked at load, and the delay it gives per failure."""

from __future__ import annotations

import datetime as dt

import pytest

from snapshot_assets.config import ConfigError, RetryConfig, parse_config

TABLE = 'source {{ server = s, table = {name} }}, destinations = [ {{ type = local, path = /x }} ]\n{extra}'


def tables(*items: tuple[str, str]) -> str:
    inner = ", ".join("{ " + TABLE.format(name=name, extra=extra) + " }" for name, extra in items)
    return f"snapshotter {{ tables = [ {inner} ] }}"


def test_defaults_and_per_table_values() -> None:
    cfg = parse_config(tables(("a", ""), ("b", "retry { backoff = 5s, max_backoff = 1m }")), env={})
    a, b = cfg.tables
    assert a.retry == RetryConfig(dt.timedelta(seconds=30), dt.timedelta(minutes=5))
    assert b.retry == RetryConfig(dt.timedelta(seconds=5), dt.timedelta(minutes=1))


def test_the_delay_doubles_per_failure_up_to_the_cap() -> None:
    r = RetryConfig(dt.timedelta(seconds=30), dt.timedelta(minutes=5))
    assert [r.delay(n).total_seconds() for n in range(7)] == [0, 30, 60, 120, 240, 300, 300]
    assert r.delay(10_000) == dt.timedelta(minutes=5)


@pytest.mark.parametrize(("extra", "path", "message"), [
    ("retry.backoff = 0s", "snapshotter.tables[0].retry.backoff", "must be greater than 0"),
    ("retry { backoff = 1m, max_backoff = 10s }", "snapshotter.tables[0].retry.max_backoff",
     "must be at least retry.backoff"),
    ("retry.backof = 5s", "snapshotter.tables[0].retry.backof", "unknown key 'backof'"),
    ("retry.max_backoff = soon", "snapshotter.tables[0].retry.max_backoff", "cannot parse duration 'soon'"),
])
def test_bad_values_name_the_key(extra: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_config(tables(("a", extra)), env={})
    assert err.value.path == path
