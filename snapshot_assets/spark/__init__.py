"""PySpark jobs: diff, snapshot and reconstruct over the change buffer and the archive.

Every job reuses the archive's single-process code inside Spark tasks (the change algebra, the
format writers and readers) and only adds the distribution: read files, shuffle by key, write
parts. `session.open_spark` provides the runtime (a local Spark Connect server by default).

The package imports none of its modules: callers import the one they use (`spark.snapshot`,
`spark.diff`, ...), so a path that never builds (the decision, `status`, a `run --once` with
nothing to write) does not load PySpark.
"""
