"""The secrets tests run real things: the private PostgreSQL cluster, moto_server, a Spark Connect server."""

from tests.aws.conftest import spark_work
from tests.pg.conftest import pg_cluster, pg_dsn

__all__ = ["pg_cluster", "pg_dsn", "spark_work"]
