"""The pending diff of a table, measured by Spark in its primary format without being written.

This is the `diff_size` the decision (pipeline/decide.py) asks for when a size trigger can change
it. The window is the one the diff build would collapse: the buffer's changes in (head, to],
folded to one net change per key against the table at the head (the STATE dataset plus the
committed deltas, caught up from the buffer where they stop), so DEFAULT-identity changes are
measured with the before-images and unchanged values the diff will carry. Then
`spark.diff_size.encoded_diff_bytes` sums the encoded lengths where the rows are.

The primary format is the first of `formats.diff` (laredo measures the diff it serializes,
which is its first format). The measurement's scratch space (`_measure/<table>` under the working
root, where every executor reaches it) is removed afterwards.

`MeasuringSpark` is the session the deciders measure with, within a time budget: the re-base
trigger sensor's tick (a short budget, inside Dagster's sensor timeout) and `snapshotter run
--once` (a longer one: it is about to run Spark jobs anyway). `diff_size` turns it into the
decision's `DiffSize`, falling back to the buffer's bytes when Spark cannot answer.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

from snapshot_assets.config import SparkConfig
from snapshot_assets.pipeline.decide import DiffSize
from snapshot_assets.pipeline.table import TablePipeline

log = logging.getLogger(__name__)


def primary_diff_format(pipe: TablePipeline) -> str:
    return pipe.cfg.diff_formats[0]


class SparkDiffSize:
    """A `DiffSize` for one table: (head, to) -> the bytes its diff would have in the primary format."""

    def __init__(self, spark: Any, pipe: TablePipeline) -> None:
        self.spark = spark
        self.pipe = pipe
        self.scratch = pipe.location(f"_measure/{pipe.name}")

    def __call__(self, from_position: str, to_position: str) -> int:
        from snapshot_assets.spark.diff_size import encoded_diff_bytes
        from snapshot_assets.spark.effects import window_partitions
        from snapshot_assets.spark.window import net_window

        pipe, spark = self.pipe, self.spark
        started = time.monotonic()
        m = pipe.manifest()
        if from_position != m.head_position:
            raise ValueError(f"{pipe.name}: cannot measure a diff from {from_position}: the head is {m.head_position}")
        self.scratch.clear()
        try:
            base = pipe.diff_base(spark, m, self.scratch / "_catch_up")  # the diff build's own base
            segments = pipe.buffer().segments(from_position, to_position)
            window = net_window(spark, segments, base, pipe.key_fields,
                                partitions=window_partitions(spark, segments), scratch=self.scratch / "_work",
                                s3=pipe.work.connection)
            fmt = primary_diff_format(pipe)
            size = encoded_diff_bytes(window.net, window.truncated, fmt, pipe.key_fields)
        finally:
            self.scratch.clear()
        log.info("%s: the diff (%s, %s] would be %d bytes of %s (measured in %.2fs)", pipe.name, from_position,
                 to_position, size, fmt, time.monotonic() - started)
        return size


MEASURE_BUDGET_S = 40.0
"""Seconds a tick may spend measuring pending diffs (Dagster's default sensor timeout is 60 s)."""
MEASURE_RETRIES = 4
"""Retries of a Spark Connect call while measuring (about 3 s in all), instead of the client's ~10 minutes."""


def bound_retries(spark: Any) -> None:
    """Make a Spark Connect session give up on an endpoint that does not answer within seconds.

    Why: the client's default policy retries for about ten minutes, and its threads keep the
    process alive that long (a daemon's sensor tick, a test run). A classic session has no client.
    """
    client = getattr(spark, "client", None)
    if client is not None:
        from pyspark.sql.connect.client.retries import DefaultPolicy

        client.set_retry_policies([DefaultPolicy(max_retries=MEASURE_RETRIES, max_backoff=2000)])


class MeasuringSpark:
    """The Spark session a tick measures pending diffs with: opened at the first measurement, within
    the tick's budget; once the budget is spent or a measurement hangs, the tick stops asking."""

    def __init__(self, spark_config: SparkConfig, budget_s: float = MEASURE_BUDGET_S) -> None:
        self.spark_config = spark_config
        self.budget_s = budget_s
        self.deadline = time.monotonic() + budget_s
        self.unavailable = ""
        self._runtime: Any = None
        self._lock = threading.Lock()
        self._measuring = False
        self._closed = False

    def _session(self) -> Any:
        if self._runtime is None:
            from snapshot_assets.spark.session import open_spark, session_from_settings, ship_project_code

            remote = bool(self.spark_config.remote)
            # Bounded before the first call to the endpoint (the session settings, then the code).
            bounded = functools.partial(session_from_settings, before_first_call=bound_retries)
            self._runtime = open_spark(self.spark_config, app_name="snapshotter-rebase-trigger", ship_code=not remote,
                                       make_session=bounded)
            if remote:
                ship_project_code(self._runtime.spark, connect=True)
        return self._runtime.spark

    def measure(self, pipe: TablePipeline, from_position: str, to_position: str) -> int:
        """The pending diff's bytes in the primary format; raises when it cannot be measured in time."""
        if self.unavailable:
            raise TimeoutError(self.unavailable)
        outcome: dict[str, Any] = {}

        def work() -> None:
            try:
                outcome["size"] = SparkDiffSize(self._session(), pipe)(from_position, to_position)
            except Exception as e:  # handed to the tick below
                outcome["error"] = e
            finally:
                with self._lock:
                    self._measuring = False
                    if self._closed:  # the tick ended while this ran past its budget
                        self._stop()

        with self._lock:
            self._measuring = True
        worker = threading.Thread(target=work, name=f"measure-{pipe.name}", daemon=True)
        worker.start()
        worker.join(max(0.0, self.deadline - time.monotonic()))
        if worker.is_alive():  # left to the client's own retries; this tick measures nothing more
            self.unavailable = f"no measurement within the tick's budget of {self.budget_s:.0f}s"
            raise TimeoutError(self.unavailable)
        if "error" in outcome:
            raise outcome["error"]
        return int(outcome["size"])

    def close(self) -> None:
        """End the session, now or, when a measurement still runs past the budget, as soon as it
        ends: the tick must not wait on it, and the session it opens must not outlive the tick
        (it would stay the process's default session, in connect mode)."""
        with self._lock:
            self._closed = True
            if not self._measuring:
                self._stop()

    def _stop(self) -> None:
        if self._runtime is not None:
            self._runtime.stop()
        self._runtime = None


def diff_size(pipe: TablePipeline, spark: MeasuringSpark, stand_in: int, log: logging.Logger) -> DiffSize:
    """The table's pending diff measured by Spark, or `stand_in` (the buffer's bytes) when it cannot be."""
    def measure(from_position: str, to_position: str) -> int:
        try:
            return spark.measure(pipe, from_position, to_position)
        except Exception as e:  # any failure of the runtime or the job: decide on the stand-in, say why
            log.warning(f"{pipe.name}: cannot measure the pending diff with Spark ({type(e).__name__}: {e}); "
                        f"the size triggers judge the buffer's {stand_in} bytes since the head instead")
            return stand_in
    return measure
