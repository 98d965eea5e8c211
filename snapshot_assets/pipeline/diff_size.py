"""The pending diff of a table, measured by Spark in its primary format without being written.

This is the `diff_size` the decision (pipeline/decide.py) asks for when a size trigger can change
it. The window is the one the diff build would collapse: the buffer's changes in (head, to],
folded to one net change per key against the table at the head (the STATE dataset plus the
committed deltas, caught up from the buffer where they stop), so DEFAULT-identity changes are
measured with the before-images and unchanged values the diff will carry. Then
`spark.diff_size.encoded_diff_bytes` sums the encoded lengths where the rows are.

The primary format is the first of `formats.diff` (laredo measures the diff it serializes,
which is its first format). The measurement's scratch space (`_measure/<table>` beside the
buffer) is removed afterwards.
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import Any

from snapshot_assets.pipeline.table import TablePipeline

log = logging.getLogger(__name__)


def primary_diff_format(pipe: TablePipeline) -> str:
    return pipe.cfg.diff_formats[0]


class SparkDiffSize:
    """A `DiffSize` for one table: (head, to) -> the bytes its diff would have in the primary format."""

    def __init__(self, spark: Any, pipe: TablePipeline) -> None:
        self.spark = spark
        self.pipe = pipe
        self.scratch = pipe.work.local_scratch(f"_measure/{pipe.name}")

    def __call__(self, from_position: str, to_position: str) -> int:
        from snapshot_assets.spark.diff_size import encoded_diff_bytes
        from snapshot_assets.spark.effects import default_partitions
        from snapshot_assets.spark.window import net_window

        pipe, spark = self.pipe, self.spark
        started = time.monotonic()
        m = pipe.manifest()
        if from_position != m.head_position:
            raise ValueError(f"{pipe.name}: cannot measure a diff from {from_position}: the head is {m.head_position}")
        shutil.rmtree(self.scratch, ignore_errors=True)
        try:
            base = pipe.diff_base(spark, m, self.scratch / "_catch_up")  # the diff build's own base
            window = net_window(spark, pipe.buffer().segments(from_position, to_position), base, pipe.key_fields,
                                partitions=default_partitions(spark), scratch=self.scratch / "_work")
            fmt = primary_diff_format(pipe)
            size = encoded_diff_bytes(window.net, window.truncated, fmt, pipe.key_fields)
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
        log.info("%s: the diff (%s, %s] would be %d bytes of %s (measured in %.2fs)", pipe.name, from_position,
                 to_position, size, fmt, time.monotonic() - started)
        return size
