"""The Dagster instance storages an end-to-end test can run on: the local default and production's.

- `sqlite`: the repository's dagster.yaml (SQLite under DAGSTER_HOME), what the quick start uses.
- `postgres`: deploy/dagster.postgres.yaml as shipped, its `env:` settings pointing at a fresh
  database in the private PostgreSQL cluster (tests/pg/conftest.py) and its S3 compute-log bucket at
  a fresh bucket on moto_server (tests/conftest.py).

Each one says which environment its processes need and proves afterwards that the runs really
went where it says (a test that silently fell back to SQLite would prove nothing).
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import yaml  # type: ignore[import-untyped]  # (no stubs installed; only safe_load/safe_dump used)

from tests.e2e.conftest import REPO
from tests.pg.conftest import PgCluster

LOCAL_YAML = REPO / "dagster.yaml"
POSTGRES_YAML = REPO / "deploy" / "dagster.postgres.yaml"
COMPUTE_LOGS_PREFIX = "dagster-compute-logs"


@dataclass(frozen=True)
class InstanceStorage:
    """One instance configuration: its dagster.yaml, the environment its `env:` values read, a check."""

    name: str
    yaml: Path
    # (DAGSTER_HOME, the run ids the test saw) -> asserts those runs are stored where this storage says
    verify: Callable[[Path, set[str]], None]
    env: dict[str, str] = field(default_factory=dict)

    def run_queue(self) -> dict[str, Any]:
        """The `run_queue` block of the dagster.yaml (empty when it has none)."""
        config: dict[str, Any] = yaml.safe_load(self.yaml.read_text())
        return dict(config.get("run_queue") or {})

    def instance_yaml(self, **overrides: Any) -> str:
        """The dagster.yaml text with top-level keys merged in (a nested dict merges one level deep)."""
        config: dict[str, Any] = yaml.safe_load(self.yaml.read_text())
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        return str(yaml.safe_dump(config, sort_keys=False))


def _verify_sqlite(home: Path, run_ids: set[str]) -> None:
    database = home / "history" / "runs.db"
    assert database.is_file(), "no SQLite run storage under DAGSTER_HOME"
    with contextlib.closing(sqlite3.connect(database)) as conn:
        stored = {row[0] for row in conn.execute("SELECT run_id FROM runs")}
    assert run_ids and run_ids <= stored, f"runs missing from {database}: {sorted(run_ids - stored)}"


def sqlite_storage() -> InstanceStorage:
    return InstanceStorage("sqlite", LOCAL_YAML, _verify_sqlite)


@contextlib.contextmanager
def postgres_storage(cluster: PgCluster, s3_endpoint: str, bucket: str, tmp: Path) -> Iterator[InstanceStorage]:
    """deploy/dagster.postgres.yaml on a database of its own (dropped afterwards) and `bucket`."""
    database = f"dagster_{secrets.token_hex(6)}"
    admin = cluster.connect(dbname="postgres")
    try:
        admin.cursor().execute(f"CREATE DATABASE {database}")
    finally:
        admin.close()
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": str(cluster.port),
        "DAGSTER_PG_USER": cluster.user,
        "DAGSTER_PG_PASSWORD": cluster.password,
        "DAGSTER_PG_DB": database,
        "DAGSTER_COMPUTE_LOGS_BUCKET": bucket,
        "DAGSTER_COMPUTE_LOGS_PREFIX": COMPUTE_LOGS_PREFIX,
        "AWS_ENDPOINT_URL_S3": s3_endpoint,
        "TMPDIR": str(tmp),  # where the compute log manager stages step output before the upload
    }

    def verify(home: Path, run_ids: set[str]) -> None:
        assert not (home / "history").exists(), "SQLite run storage appeared under DAGSTER_HOME"
        conn = cluster.connect(dbname=database)
        try:
            cursor = conn.cursor()
            cursor.execute("SELECT run_id FROM runs")
            stored = {row[0] for row in cursor.fetchall()}
        finally:
            conn.close()
        assert run_ids and run_ids <= stored, f"runs missing from PostgreSQL: {sorted(run_ids - stored)}"
        listing = boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(
            Bucket=bucket, Prefix=f"{COMPUTE_LOGS_PREFIX}/")
        logged = {run_id for run_id in run_ids
                  if any(run_id in entry["Key"] for entry in listing.get("Contents", []))}
        assert logged, f"no run's compute logs in s3://{bucket}/{COMPUTE_LOGS_PREFIX}/"

    try:
        yield InstanceStorage("postgres", POSTGRES_YAML, verify, env)
    finally:
        admin = cluster.connect(dbname="postgres")
        try:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        finally:
            admin.close()
