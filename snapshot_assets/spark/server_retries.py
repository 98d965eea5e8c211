"""How a session on the local Spark Connect server retries a failed call.

Spark Connect's client retries a call that failed as UNAVAILABLE for up to ten minutes in all
(`DefaultPolicy`), which suits a remote server that may come back. The local server's process is on
this host, so a server that ended (killed, or out of memory with `-XX:+ExitOnOutOfMemoryError`) is
known at once: the call fails then, and the run names the server and its log
(`SparkRuntime.server_lost`), instead of retrying a dead port for ten minutes.
"""

from __future__ import annotations

from pyspark.sql.connect.client.retries import DefaultPolicy

from snapshot_assets.spark.connect_server import ServerInfo, server_lost


class LocalServerRetries(DefaultPolicy):
    """Spark Connect's default retries, for as long as the local server `server` runs."""

    def __init__(self, server: ServerInfo) -> None:
        super().__init__()
        self._server = server

    def can_retry(self, e: BaseException) -> bool:
        return bool(super().can_retry(e)) and server_lost(self._server) is None


__all__ = ["LocalServerRetries"]
