"""The local server's Python worker daemon: pyspark's own, with the task code imported before it forks.

Spark starts one daemon per worker pool (`spark.python.daemon.module`, set by `server_command` for
the local server) and forks a worker from it for each Python task that finds none idle. A forked
worker inherits the daemon's imported modules, so importing the tasks' code here, once, spares every
new worker its imports (pyarrow, pandas through pyspark's Arrow serializers, this project's archive
code): a one-task job on a worker forked after the idle kill took 0.95 s with them preloaded, 1.97 s
without. It matters because Spark ends workers that sit idle for a minute: without
this, the first Python task of a run that comes more than a minute after the last one would wait
for those imports again.

Only the local server uses it: its sessions share one worker pool, which lives as long as the
server (see connect_host.py); a server started by a different version of this code is restarted
(`code_fingerprint`), so the preloaded modules are never stale.
"""

from __future__ import annotations

import pyspark.daemon
import pyspark.sql.pandas.serializers  # the Arrow UDF serializers every task uses
import pyspark.worker

# Every module whose functions the tasks run (the builds' entry modules import the rest); the
# package itself imports nothing, so they are named here.
import snapshot_assets.spark.assemble
import snapshot_assets.spark.diff
import snapshot_assets.spark.reconstruct
import snapshot_assets.spark.snapshot  # noqa: F401

if __name__ == "__main__":
    pyspark.daemon.manager()
