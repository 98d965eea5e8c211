"""Restore fixtures: the private PostgreSQL cluster (tests/pg), a working directory whose local Spark
Connect server is stopped afterwards (tests/e2e), and the suite's classic Spark session (tests/spark)."""

from __future__ import annotations

from tests.e2e.conftest import workdir
from tests.pg.conftest import pg_cluster, pg_dsn
from tests.spark.conftest import spark

__all__ = ["pg_cluster", "pg_dsn", "spark", "workdir"]
