"""The private PostgreSQL cluster of tests/pg, for the group acceptance test."""

from __future__ import annotations

from tests.pg.conftest import pg_cluster, pg_dsn

__all__ = ["pg_cluster", "pg_dsn"]
