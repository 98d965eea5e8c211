"""End-to-end fixtures: the private PostgreSQL cluster (tests/pg), and a working directory per test.

The working directory is the cwd of every process a test starts (`snapshotter run --once`,
`dagster-webserver`, `dagster-daemon`), so relative state such as the local Spark Connect server's
`.snapshotter/spark-connect` lands under it; the fixture stops that server afterwards (it runs in
its own session and would otherwise outlive the test).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshot_assets.spark.connect_server import stop_local_connect_server
from tests.pg.conftest import pg_cluster, pg_dsn

__all__ = ["e2e_env", "pg_cluster", "pg_dsn", "workdir"]

REPO = Path(__file__).resolve().parents[2]
#: The marks of a multi-process scenario (a daemon, run workers, a Spark server): slow, and its own
#: 20-minute bound. Alone on 2 cores one takes 2-7 minutes; beside another scenario on the other
#: xdist worker, 2-4 times as long.
SCENARIO = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory to run the product in; its local Spark Connect server is stopped at the end."""
    work = tmp_path / "work"
    work.mkdir()
    try:
        yield work
    finally:
        stop_local_connect_server(work / ".snapshotter" / "spark-connect")


def e2e_env(**extra: str) -> dict[str, str]:
    """This environment without anything that would point the product elsewhere, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SNAPSHOTTER", "DAGSTER_", "SPARK_REMOTE", "SPARK_CONNECT"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env
