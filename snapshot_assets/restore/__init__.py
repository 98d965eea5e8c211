"""Restore: a table as of a pinned snapshot or a position, written from the archive into PostgreSQL.

The flow, one module per step:
  point.py     which artifacts rebuild the table (a label's pinned snapshot, or the plan as of a
               position) and the table's columns and key, from the manifest alone;
  target.py    the PostgreSQL side: a uniquely named staging table made from the manifest's
               columns, the swap into place in one transaction, and the cleanup of what a crashed
               restore left;
  copy_text.py how an archive row becomes a line of COPY text (the exact inverse of the source's
               conversion, `resources.subscribers.pgtypes`);
  stream.py    small tables: one process folds the archive and COPYs it;
  spark_copy.py large tables: the Spark reconstruction's tasks COPY their own partitions;
  run.py       the entry point the CLI and the Dagster job share.
Nothing is visible under the target's name until the swap commits: a failure anywhere before it
leaves no target (or the old one, with --replace) and drops the staging table.
"""
