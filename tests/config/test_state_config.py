"""`state { bucket_size }`: the size a state bucket aims at, checked at load."""

from __future__ import annotations

import pytest

from snapshot_assets.config import DEFAULT_BUCKET_BYTES, ConfigError, parse_config
from tests.config.test_retry_config import tables


def test_default_and_per_table_bucket_size() -> None:
    cfg = parse_config(tables(("a", ""), ("b", "state { bucket_size = 64MiB }")), env={})
    assert [t.bucket_bytes for t in cfg.tables] == [DEFAULT_BUCKET_BYTES, 64 * 1024 * 1024]


@pytest.mark.parametrize(("extra", "path", "message"), [
    ("state.bucket_size = 1MiB", "snapshotter.tables[0].state.bucket_size", "must be at least 8 MiB"),
    ("state.buckets = 3", "snapshotter.tables[0].state.buckets", "unknown key 'buckets'"),
])
def test_bad_bucket_sizes_name_the_key(extra: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_config(tables(("a", extra)), env={})
    assert err.value.path == path
