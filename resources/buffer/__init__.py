"""The durable change buffer: the only state outside the archive.

Per table, append-only Parquet segments (Spark reads them directly) plus a small JSON index (a
sensor reads it in milliseconds). `ChangeBuffer` writes (one process per table); `BufferReader`
answers the same read questions from any other process. Layout under the buffer root:

    <root>/<table>/index.json
    <root>/<table>/segments/<number>-changes.parquet | <number>-snapshot.parquet

Storage is a local directory; filesystem operations sit behind `BufferStorage` so an S3 prefix can
be added later (not implemented). Retention: `ChangeBuffer.truncate_below`, or from another process
`BufferReader.release_below` (a request the writer honours after its next seal).

See `buffer.py` for the crash-safety argument, `segments.py` for the row schema, `index.py` for
the index and its recovery.
"""

from resources.buffer.buffer import ChangeBuffer
from resources.buffer.errors import (
    BadChange,
    BadEventOrder,
    BufferCorrupt,
    ChangeBufferError,
    PositionWentBackwards,
    RangeNotAvailable,
    ResyncInWindow,
    WriterLockHeld,
)
from resources.buffer.index import Recovery, ResyncMarker
from resources.buffer.reader import BufferReader, BufferStats, SegmentRef
from resources.buffer.segments import SCHEMA, SNAPSHOT_ACTION
from resources.buffer.storage import BufferStorage, LocalStorage

__all__ = [
    "SCHEMA",
    "SNAPSHOT_ACTION",
    "BadChange",
    "BadEventOrder",
    "BufferCorrupt",
    "BufferReader",
    "BufferStats",
    "BufferStorage",
    "ChangeBuffer",
    "ChangeBufferError",
    "LocalStorage",
    "PositionWentBackwards",
    "RangeNotAvailable",
    "Recovery",
    "ResyncInWindow",
    "ResyncMarker",
    "SegmentRef",
    "WriterLockHeld",
]
