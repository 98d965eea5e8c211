"""The small-table path: one process folds the archive (the Python reader) and COPYs the result.

The whole table is held by this process while it is folded, which is why `run.py` only takes this
path below a row count (`stream_max_rows`); above it the Spark path's tasks do the work.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from snapshot_assets.archive.reader import ArchiveReader, ReplayPlan
from snapshot_assets.restore.copy_text import CopyEncoder
from snapshot_assets.restore.target import Connection, TableName, copy_into

BATCH_ROWS = 5_000


def stream_copy(conn: Connection, staging: TableName, specs: Sequence[tuple[str, str]], reader: ArchiveReader,
                plan: ReplayPlan) -> int:
    """Fold `plan` and COPY its rows into `staging` (columns and converter specs `specs`); the row count."""
    state = reader.fold(plan)
    encoder = CopyEncoder(specs)
    rows = iter(state.rows())

    def chunks() -> Iterator[bytes]:
        while batch := list(itertools.islice(rows, BATCH_ROWS)):
            yield encoder.batch(batch)

    copy_into(conn, staging, encoder.names, chunks())
    return len(state)
