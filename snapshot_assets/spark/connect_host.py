"""The local Spark Connect server's driver program: a classic session that serves Spark Connect.

Why not `SparkConnectServer`'s own main: it forces artifact isolation on, and with isolation every
Connect session gets a Python worker pool of its own. Each run then starts a Python worker daemon
and imports pyarrow and this project's task code in it before its first Python task can run:
about 2.5 s of every run on 2 cores. The local server's sessions all run this project's installed
code (the local runtime ships none: `SparkPlan.ships_code`), so nothing needs isolating. This
program starts the session with isolation off and the Connect plugin on (`server_command` passes
both), so every session shares one worker pool, which outlives the session that started it: a run
after the first finds its Python workers warm.

Run by `spark-submit` as the application's Python file; it imports only pyspark and the standard
library (it is run as a file, not as part of the package). It serves until it is sent SIGTERM or
SIGINT, then stops the session (the JVM exits with it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

# Run as a file, this folder leads sys.path, where its modules could shadow others by name.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]


def main() -> None:
    from pyspark.sql import SparkSession

    # Blocked before the session starts, so a stop that comes while it starts is not lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    spark = SparkSession.builder.getOrCreate()
    print("snapshotter: Spark Connect is being served", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    with contextlib.suppress(Exception):  # the JVM, sent the same signal, may be gone already
        spark.stop()


if __name__ == "__main__":
    main()
