"""Group fixtures: the private PostgreSQL cluster of tests/pg (the acceptance test), and a
two-member group configuration active for the code location (sensors, jobs) with a temporary
Dagster instance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from snapshot_assets.config import SnapshotterConfig
from tests.active_config import use_config
from tests.dagster_instances import checked_instance
from tests.pg.conftest import pg_cluster, pg_dsn

__all__ = ["group_config", "instance", "pg_cluster", "pg_dsn"]


@pytest.fixture
def group_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SnapshotterConfig]:
    """`public.accounts` and `public.transfers` (PostgreSQL sources never connected to) in group `ledger`."""
    member = """{{ source {{ type = postgres, dsn = "host=127.0.0.1 dbname=bank", table = {t} }}
       diff.interval = 1s, retry {{ backoff = 1s, max_backoff = 1s }}
       formats {{ snapshot = [jsonl], diff = [jsonl] }}
       destinations = [ {{ type = local, path = "{root}/archive" }} ] }}"""
    path = tmp_path / "snapshotter.conf"
    path.write_text(f"""snapshotter {{
  buffer {{ path = "{tmp_path / 'buffer'}" }}
  tables = [ {member.format(t="accounts", root=tmp_path)}, {member.format(t="transfers", root=tmp_path)} ]
  groups = [ {{ name = ledger, tables = [ accounts, transfers ] }} ]
}}""")
    yield from use_config(monkeypatch, path)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with checked_instance() as inst:
        yield inst
