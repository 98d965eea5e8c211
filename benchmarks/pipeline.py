"""The pipeline end to end: freshness (source commit → manifest head) and snapshot throughput.

Why: the archive is only as useful as it is fresh, and a re-base must stay affordable as tables
grow. Two questions, measured in one run on the real code paths:

1. Freshness. A generator source (`GeneratorSubscriber`, paced at `--rate` changes/s) is ingested
   continuously on a thread (`run_ingest` → `ChangeBuffer`, sealed every `--seal-interval` s), while
   the main thread runs what the re-base trigger sensor and the diff + manifest assets run, every
   `--interval` s (the table's `diff.interval`): `TablePipeline.decide`, then `build` (Spark) and
   `commit`. Every cycle opens its own Spark session, as every Dagster run does:
     - warm: a client session on the local Spark Connect server (the default runtime), started once
       before the phase and reused by every cycle;
     - cold: a classic `local[2]` session whose JVM is booted for the cycle and shut down after it
       (what a naive session per run costs; still a lower bound of a run process, which would
       also pay interpreter start and imports).
   Freshness of a change = the time the manifest head moved past it (the manifest object's mtime:
   it is written, fsynced and renamed into place by the commit) − the wall-clock time the
   generator produced its transaction (recorded, per commit position, when the source emitted the
   transaction's end on the ingest thread). Every committed change counts once; p50/p95/max are
   over changes. This is measured, not inferred: the buffer's "oldest change age" at decision time
   plus the build time would miss the wait for the next tick and count only the oldest change. A
   cycle that overruns the interval starts the next one at once (a sensor's next tick; the run
   queue allows one run per table). Each runtime has its own table, buffer and archive, both
   ingested side by side all along, and their cycles run in alternating blocks (`--blocks`), so
   load from other work on the machine falls on both alike; the first diff of every block carries
   the backlog of the other runtime's block (or of the initial snapshot), so it is a warm-up and
   not counted.

2. Snapshot throughput. For each size (default 1M and 3M rows; `--big` adds 10M, about 25 minutes
   more on 2 cores, so not in the default run), a buffer holding the generator's initial load of N
   rows (streamed from the generator's own row model, so the ingest process never holds the table),
   then the real Dagster `snapshot_job` (snapshot + manifest assets, `execute_in_process`, what
   `snapshotter run --once` runs) in a fresh child process against the warm server: the initial
   snapshot (from the buffer's initial-load segment). Re-bases are measured by benchmarks/rebase.py,
   after three kinds of changes and against peers: a forced re-base here, with nothing changed since
   the snapshot, would only copy the unchanged buckets and say nothing of a re-base's cost.
   rows/s = rows / the job's wall time (Spark build, upload of every format, manifest commit,
   Dagster's run bookkeeping). Memory: the child's peak RSS (`getrusage(RUSAGE_SELF).ru_maxrss`):
   the Dagster-side process that drives the build, which never holds the table; the server JVM's
   peak RSS (VmHWM of /proc/<pid>/status, reset before each job through /proc/<pid>/clear_refs);
   and the peak of the server's whole process tree (its session: JVM + Python workers), sampled
   every 0.5 s.

Every row carries the 1-minute load average (mean and max over the measurement) because other
work may share the machine. Temporary directories hold buffers, archives and the server state;
the Spark Connect server started here is stopped at the end, also on failure.

Prints the tables and writes the section `## Pipeline: freshness and snapshot throughput` of
docs/benchmarks.md (only that section; the others are kept).

Run: `.venv/bin/python benchmarks/pipeline.py [--quick] [--big] [--sizes 1000000,3000000]`
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Set in the measuring process: a frozen copy of the project's packages, imported instead of the
#: working tree (here, by the run processes and by the Spark servers' Python workers through
#: PYTHONPATH), so commits landing during a 30-minute run neither mix code versions nor make the
#: local Spark Connect server restart for new code in the middle of a measurement.
FROZEN_CODE = "PIPELINE_BENCH_CODE"
REVISION = "PIPELINE_BENCH_REVISION"
PACKAGES = ("snapshot_assets", "resources", "sensors")
sys.path.insert(0, os.environ.get(FROZEN_CODE) or str(ROOT))

from resources.buffer import BufferReader, ChangeBuffer  # noqa: E402
from resources.ingest import run_ingest  # noqa: E402
from resources.subscribers.events import (  # noqa: E402
    ChangeEvent,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TxEnd,
)
from resources.subscribers.generator import GeneratorSubscriber  # noqa: E402
from snapshot_assets.archive import keys  # noqa: E402
from snapshot_assets.archive.positions import parse_lsn  # noqa: E402
from snapshot_assets.config import SparkConfig, TableConfig, parse_config  # noqa: E402
from snapshot_assets.pipeline.table import TablePipeline  # noqa: E402

SECTION = "## Pipeline: freshness and snapshot throughput"
DOCS = ROOT / "docs" / "benchmarks.md"
TABLE = "public.users"
FORMATS = ("jsonl", "protobuf", "parquet")
STATE_SUBDIR = Path(".snapshotter") / "spark-connect"  # SparkResource's default, relative to the run's cwd
RESULT_MARK = "PIPELINE-BENCH-RESULT "
BIG_ROWS = 10_000_000

log = logging.getLogger("benchmarks.pipeline")


# ---- small measuring tools ------------------------------------------------------------------------


def load1() -> float:
    return os.getloadavg()[0]


class Sampler:
    """Samples the 1-minute load average (and optionally the RSS of a process session) on a thread."""

    def __init__(self, interval_s: float = 0.5, session: int | None = None) -> None:
        self.interval_s = interval_s
        self.session = session
        self.loads: list[float] = []
        self.peak_tree_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.loads.append(load1())
            if self.session is not None:
                self.peak_tree_kb = max(self.peak_tree_kb, session_pss_kb(self.session)[0])
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.loads.append(load1())

    @property
    def load_text(self) -> str:
        return f"{sum(self.loads) / len(self.loads):.1f} (max {max(self.loads):.1f})"


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def session_pids(session: int) -> list[int]:
    """Every process in session `session` (a process the kernel lists but ends meanwhile is left out)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == session:
            pids.append(int(entry.name))
    return pids


def session_rss_kb(session: int) -> int:
    """The summed VmRSS of every process in session `session`: the server JVM, started in a session of its
    own, and its Python workers (whose daemon makes its own process group, but stays in the session)."""
    return sum(_status_kb(pid, "VmRSS") for pid in session_pids(session))


def pss_kb(pid: int) -> int:
    """`pid`'s proportional set size: its private pages, plus each page it shares with n processes at
    1/n. Why beside RSS: forked Python workers share their daemon's pages (the imported modules), which
    a sum of RSS counts once per worker, so that sum grows with the number of workers alive, not with
    the memory they use; a sum of PSS is the memory the processes take together."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def session_pss_kb(session: int) -> tuple[int, int]:
    """The summed PSS of every process in session `session`, and the same without the session's leader
    (for the Spark Connect server: its JVM and Python workers together, and the workers alone)."""
    sizes = {pid: pss_kb(pid) for pid in session_pids(session)}
    return sum(sizes.values()), sum(kb for pid, kb in sizes.items() if pid != session)


def reset_peak_rss(pid: int) -> bool:
    """Reset `pid`'s VmHWM to its current RSS (Linux >= 4.0); False when refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def mib(kb: int) -> str:
    return f"{kb / 1024:,.0f} MiB"


# ---- configuration --------------------------------------------------------------------------------


def table_config(work: Path, *, seed: int, rows: int, rate: float | None, interval_s: float,
                 seal_interval_s: float) -> TableConfig:
    """The table as a code location's config file describes it (all three formats, no re-base triggers)."""
    generator = f"seed = {seed}, rows = {rows}" + (f", rate = {rate}" if rate else "")
    text = f"""snapshotter {{
  source {{ type = generator, schema = public, table = users, generator {{ {generator} }} }}
  key_fields = [id]
  diff.interval = {interval_s}s
  # every re-base trigger off: the freshness loop writes only diffs (zero disables a trigger)
  snapshot {{ min_interval = 0s, max_interval = 0s }}
  destinations = [ {{ type = local, path = {json.dumps(str(work / "archive"))} }} ]
  formats {{ snapshot = [{", ".join(FORMATS)}], diff = [{", ".join(FORMATS)}] }}
  buffer {{ path = {json.dumps(str(work / "buffer"))}, seal_interval = {seal_interval_s}s }}
}}
"""
    (work / "snapshotter.conf").write_text(text)
    return parse_config(text, file=str(work / "snapshotter.conf"), env={}).tables[0]


# ---- sources --------------------------------------------------------------------------------------


class TimedSource:
    """A subscriber wrapper that records when each source transaction was produced.

    `produced[commit LSN] = (wall time of its TxEnd, changes in it)`: the generator emits a
    transaction's changes and then its end at its paced time, so the TxEnd's time is the source
    commit time. Recorded on the ingest thread, before the buffer sees the events.
    """

    def __init__(self, inner: GeneratorSubscriber) -> None:
        self.inner = inner
        self.ordering = inner.ordering
        self.produced: dict[int, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def events(self, start: str | None) -> Iterator[Event]:
        changes = 0
        for event in self.inner.events(start):
            if isinstance(event, ChangeEvent):
                changes += 1
            elif isinstance(event, TxEnd):
                position = parse_lsn(event.position)
                assert position is not None
                with self._lock:
                    self.produced[position] = (time.time(), changes)
                changes = 0
            yield event

    def in_range(self, from_exclusive: str, to_inclusive: str) -> list[tuple[float, int]]:
        lo, hi = parse_lsn(from_exclusive), parse_lsn(to_inclusive)
        assert lo is not None and hi is not None
        with self._lock:
            return [v for p, v in self.produced.items() if lo < p <= hi]

    def acknowledge(self, position: str) -> None:
        self.inner.acknowledge(position)

    def close(self) -> None:
        self.inner.close()


class StreamedInitialLoad:
    """The generator's initial load of `rows` rows as a stream that keeps no row.

    `GeneratorSubscriber` materializes its table in memory (~1.7 KB per row: 10M rows would need
    ~17 GB). This yields exactly the rows `GeneratorSubscriber(table, seed=seed, rows=rows)` loads,
    in the same order (the same row model drawing from the same seeded random stream, checked by
    `check_streamed_rows`), then ends: a finite source the ingest loop finishes cleanly.
    """

    ordering = "lsn"

    def __init__(self, table: str, *, seed: int, rows: int) -> None:
        self.rows = rows
        self._shape = GeneratorSubscriber(table, seed=seed, rows=0, changes=0)
        self._closed = threading.Event()

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        # The generator's own row model (private API, on purpose: the same rows, not a lookalike).
        from resources.subscribers import generator

        model = generator._Model(self._shape._cfg)
        for _ in range(self.rows):
            if self._closed.is_set():
                return
            yield model._new_row(generator._BASE_TIME)

    def events(self, start: str | None) -> Iterator[Event]:
        if start is not None:
            return  # already durable: nothing follows the initial load
        yield SchemaEvent(self._shape.schema)
        yield ResyncBegin("initial load")
        yield from (SnapshotRow(row) for row in self.iter_rows())
        yield ResyncEnd(self._shape.initial_position, self.rows)

    def acknowledge(self, position: str) -> None:
        pass

    def close(self) -> None:
        self._closed.set()


def check_streamed_rows(seed: int, rows: int = 500) -> None:
    """The streamed load equals the generator's initial load (same keys, same rows)."""
    expected = GeneratorSubscriber(TABLE, seed=seed, rows=rows, changes=0)
    model = expected.table_at(expected.initial_position)
    streamed = list(StreamedInitialLoad(TABLE, seed=seed, rows=rows).iter_rows())
    if list(model.values()) != streamed:
        raise RuntimeError("the streamed initial load differs from the generator's initial load")


# ---- Spark sessions -------------------------------------------------------------------------------


@dataclass
class Session:
    spark: Any
    mode: str
    open_s: float
    note: str = ""


def _code_path(batches: Iterator[Any]) -> Iterator[Any]:
    """A Spark task reporting where its Python worker imports this project from."""
    import pyarrow as pa

    import snapshot_assets

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"path": snapshot_assets.__file__}])


def check_code(spark: Any, where: str) -> None:
    """The driver and the Spark workers run the frozen copy of the code (see FROZEN_CODE)."""
    import snapshot_assets

    frozen = os.environ[FROZEN_CODE]
    worker = spark.range(1).mapInArrow(_code_path, "path STRING").collect()[0][0]
    for who, path in (("this process", snapshot_assets.__file__), (f"the {where} workers", worker)):
        if not str(path).startswith(frozen):
            raise RuntimeError(f"{who} import snapshot_assets from {path}, not from the frozen copy {frozen}")


def open_session(mode: str, state_dir: Path) -> Session:
    """A session the way a run gets one: warm = client of the local Connect server; cold = a new JVM."""
    from snapshot_assets.spark.session import open_spark

    started = time.monotonic()
    if mode == "warm":
        runtime = open_spark(SparkConfig(), state_dir=state_dir)
        if runtime.mode != "connect-local":
            raise RuntimeError(f"expected the local Spark Connect server, got {runtime.mode}: {runtime.note}")
    else:
        runtime = open_spark(SparkConfig(master="local[2]"), state_dir=state_dir)
        runtime.spark.sparkContext.setLogLevel("ERROR")
    return Session(runtime.spark, mode, time.monotonic() - started, runtime.note)


def close_session(session: Session) -> None:
    """End the session; for a classic one also shut its JVM down, so the next one boots cold."""
    session.spark.stop()
    if session.mode != "cold":
        return
    from pyspark.core.context import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:  # the gateway JVM exits when its stdin closes
        proc.stdin.close()
        proc.wait(timeout=60)
    SparkContext._gateway = None
    SparkContext._jvm = None


# ---- 1. freshness ---------------------------------------------------------------------------------


@dataclass
class Cycle:
    index: int
    kind: str
    changes: int
    open_s: float
    build_s: float
    commit_s: float
    close_s: float
    ages: list[tuple[float, int]] = field(default_factory=list)  # (freshness s, changes)

    @property
    def seconds(self) -> float:
        return self.open_s + self.build_s + self.commit_s


class FreshnessPhase:
    """One runtime's freshness measurement: its own table, buffer, archive and ingest thread.

    The phases of both runtimes run side by side (each table ingested all along) and their cycles
    are measured in alternating blocks, so load from outside (other work on the machine) falls on
    both rows alike. The first cycle of every block carries the backlog built up while the other
    runtime measured (or, in the first block, during the initial snapshot): it is a warm-up, not counted.
    """

    def __init__(self, mode: str, work: Path, state_dir: Path, args: argparse.Namespace) -> None:
        self.mode, self.state_dir, self.args = mode, state_dir, args
        work.mkdir(parents=True)
        self.cfg = table_config(work, seed=args.seed, rows=args.fresh_rows, rate=args.rate,
                                interval_s=args.interval, seal_interval_s=args.seal_interval)
        self.source = TimedSource(GeneratorSubscriber(TABLE, seed=args.seed, rows=args.fresh_rows, rate=args.rate))
        self.pipe = TablePipeline(self.cfg)
        self.cycles: list[Cycle] = []
        self.warm_ups: set[int] = set()
        self.loads: list[float] = []
        self.initial_snapshot_s = math.nan
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._ingest, name=f"ingest-{mode}", daemon=True)

    def _ingest(self) -> None:
        cfg = self.cfg
        try:
            with ChangeBuffer(cfg.buffer.path, cfg.name, ordering=self.source.ordering,
                              seal_interval=cfg.buffer.seal_interval.total_seconds(),
                              seal_changes=cfg.buffer.seal_changes) as buffer:
                run_ingest(self.source, buffer, stop=self._stop)
        except BaseException as e:  # reported by the main thread
            self._errors.append(e)
        finally:
            self.source.close()

    def _check(self) -> None:
        if self._errors:
            raise RuntimeError(f"{self.mode}: ingest failed: {self._errors[0]}") from self._errors[0]

    def start(self) -> None:
        """Start ingesting; once the initial load is durable, write the initial snapshot (not measured)."""
        self._thread.start()
        reader = BufferReader(self.cfg.buffer.path, self.cfg.name)
        deadline = time.monotonic() + 300
        while not _durable(reader):
            self._check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.mode}: the initial load did not become durable in 300 s")
            time.sleep(0.1)
        started = time.monotonic()
        session = open_session(self.mode, self.state_dir)
        try:
            if self.mode == "cold":
                check_code(session.spark, "classic session's Python")
            nxt = self.pipe.decide()
            if nxt.kind != "snapshot":
                raise RuntimeError(f"expected the initial snapshot, the decision is {nxt}")
            self.pipe.commit(self.pipe.build(session.spark, nxt).artifact)
        finally:
            close_session(session)
        self.initial_snapshot_s = time.monotonic() - started
        print(f"  {self.mode}: initial snapshot of {self.args.fresh_rows:,} rows in {self.initial_snapshot_s:.1f} s",
              flush=True)

    def block(self, measured: int) -> None:
        """One warm-up cycle then `measured` cycles, one every diff.interval (at once after an overrun)."""
        print(f"  {self.mode}: {measured} measured cycles + 1 warm-up, every {self.args.interval:g} s", flush=True)
        with Sampler(2.0) as sampler:
            tick = time.monotonic()
            for i in range(measured + 1):
                time.sleep(max(0.0, tick - time.monotonic()))
                tick = time.monotonic() + self.args.interval
                index = len(self.cycles)
                if i == 0:
                    self.warm_ups.add(index)
                self.cycles.append(one_cycle(index, self.mode, self.pipe, self.source, self.state_dir))
                self._check()
                c = self.cycles[-1]
                print(f"    cycle {index:2d}{' (warm-up)' if i == 0 else '':10s}: {c.kind} of {c.changes:5d} changes, "
                      f"session {c.open_s:5.2f} s, build {c.build_s:5.2f} s, commit {c.commit_s:4.2f} s, "
                      f"freshness max {max((a for a, _ in c.ages), default=math.nan):5.1f} s, "
                      f"load {load1():.1f}", flush=True)
        self.loads += sampler.loads

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    @property
    def measured(self) -> list[Cycle]:
        return [c for c in self.cycles if c.index not in self.warm_ups]

    def ages(self) -> list[float]:
        return sorted(age for c in self.measured for age, n in c.ages for _ in range(n))

    def mean(self, attr: str) -> float:
        values = [float(getattr(c, attr)) for c in self.measured if c.kind == "diff"]
        return sum(values) / len(values) if values else math.nan

    @property
    def load(self) -> str:
        return f"{sum(self.loads) / len(self.loads):.1f} (max {max(self.loads):.1f})" if self.loads else "?"


def manifest_mtime(cfg: TableConfig) -> float:
    """When the manifest head last moved: the mtime of the local destination's manifest object."""
    path = Path(cfg.destinations[0]["path"]) / keys.manifest_key(cfg.key_prefix)
    return path.stat().st_mtime


def measure_freshness(tmp: Path, state_dir: Path, args: argparse.Namespace) -> list[FreshnessPhase]:
    """Both runtimes side by side, measured in `--blocks` alternating blocks of cycles."""
    phases = [FreshnessPhase(mode, tmp / f"fresh-{mode}", state_dir, args) for mode in ("warm", "cold")]
    try:
        for phase in phases:
            phase.start()
        sizes = [args.cycles // args.blocks + (1 if b < args.cycles % args.blocks else 0) for b in range(args.blocks)]
        for b, size in enumerate(sizes):
            for phase in phases:
                print(f"freshness block {b + 1}/{len(sizes)}, {phase.mode} runtime:", flush=True)
                phase.block(size)
    finally:
        for phase in phases:
            phase.stop()
    return phases


def _durable(reader: BufferReader) -> str | None:
    try:
        return reader.durable_position()
    except FileNotFoundError:
        return None


def one_cycle(index: int, mode: str, pipe: TablePipeline, source: TimedSource, state_dir: Path) -> Cycle:
    """One tick: a session as a run opens it, the sensor's decision, the diff asset, the manifest asset."""
    t0 = time.monotonic()
    session = open_session(mode, state_dir)
    t1 = time.monotonic()
    if mode == "warm" and not session.note.startswith("reused"):
        close_session(session)
        raise RuntimeError(f"cycle {index}: the warm server was not reused ({session.note}): the measurement "
                           "would include a server start")
    try:
        nxt = pipe.decide()
        if nxt.kind == "none":
            return Cycle(index, "none", 0, t1 - t0, time.monotonic() - t1, 0.0, 0.0)
        if nxt.kind != "diff" or nxt.from_position is None or nxt.to_position is None:
            raise RuntimeError(f"the freshness loop expects diffs only, the decision is {nxt}")
        built = pipe.build(session.spark, nxt)
        t2 = time.monotonic()
        pipe.commit(built.artifact)
        t3 = time.monotonic()
        committed_at = manifest_mtime(pipe.cfg)
    finally:
        t4 = time.monotonic()
        close_session(session)
    txs = source.in_range(nxt.from_position, nxt.to_position)
    ages = [(committed_at - produced, n) for produced, n in txs if n]
    changes = sum(n for _, n in ages)
    return Cycle(index, "diff", changes, t1 - t0, t2 - t1, t3 - t2, time.monotonic() - t4, ages)


# ---- 2. snapshot throughput -----------------------------------------------------------------------


@dataclass
class SnapshotResult:
    rows: int
    job_s: float
    spark_s: float
    build_s: float
    driver_peak_kb: int
    driver_start_kb: int
    jvm_peak_kb: int
    tree_peak_kb: int
    bytes: dict[str, int]
    load: str
    driver_end_anon_kb: int = 0
    driver_end_file_kb: int = 0
    ingest_s: float = 0.0
    jvm_peak_reset: bool = True

    @property
    def rate(self) -> float:
        return self.rows / self.job_s


def stage_buffer(work: Path, rows: int, seed: int) -> float:
    """A buffer (and config) holding the generator's initial load of `rows` rows, streamed; returns seconds."""
    work.mkdir(parents=True)
    cfg = table_config(work, seed=seed, rows=rows, rate=None, interval_s=30, seal_interval_s=1)
    source = StreamedInitialLoad(TABLE, seed=seed, rows=rows)
    started = time.monotonic()
    with ChangeBuffer(cfg.buffer.path, cfg.name, ordering=source.ordering, seal_interval=1.0,
                      seal_changes=cfg.buffer.seal_changes) as buffer:
        result = run_ingest(source, buffer, stop=threading.Event())
    if not result.finished or result.durable_position is None:
        raise RuntimeError(f"staging {rows:,} rows did not finish: {result}")
    return time.monotonic() - started


def snapshot_job(work: Path, run_dir: Path, server_pid: int, rows: int) -> SnapshotResult:
    """Run the snapshot job in a fresh child process; its cwd `run_dir` holds the warm server's state
    where `SparkResource` looks by default (`.snapshotter/spark-connect`)."""
    reset = reset_peak_rss(server_pid)
    out = work / "worker-initial.log"
    env = {**os.environ, "SNAPSHOTTER_CONFIG": str(work / "snapshotter.conf")}
    env.pop("DAGSTER_HOME", None)
    with Sampler(0.5, session=server_pid) as sampler, open(out, "w") as log_file:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--snapshot-worker"],
                              cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=log_file, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(out.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"the initial snapshot worker failed ({done.returncode}); {out} ends with:\n{tail}")
    from snapshot_assets.spark.connect_server import local_server_info

    info = local_server_info(run_dir / STATE_SUBDIR)
    if info is None or info.pid != server_pid:
        raise RuntimeError(f"the initial snapshot job did not run on the warm server pid {server_pid} "
                           f"(now: {info.pid if info else 'none'}): its time would include a server start")
    line = next(x for x in done.stdout.splitlines() if x.startswith(RESULT_MARK))
    data = json.loads(line[len(RESULT_MARK):])
    if data["rows"] != rows:
        raise RuntimeError(f"the initial snapshot holds {data['rows']} rows, expected {rows}")
    return SnapshotResult(jvm_peak_kb=_status_kb(server_pid, "VmHWM"), tree_peak_kb=sampler.peak_tree_kb,
                          load=sampler.load_text, jvm_peak_reset=reset, **data)


def snapshot_worker() -> int:
    """The child: the Dagster run process. Runs `snapshot_job` (the initial snapshot) for the configured table,
    prints JSON."""
    import dagster as dg

    import snapshot_assets
    from snapshot_assets.definitions import defs
    from snapshot_assets.tables import FROM_TAG, TABLE_TAG, TO_TAG, TRIGGER_TAG, config, pipeline

    if not snapshot_assets.__file__ or not snapshot_assets.__file__.startswith(os.environ[FROZEN_CODE]):
        raise RuntimeError(f"the worker imports {snapshot_assets.__file__}, not the frozen copy")
    table = config().tables[0].name
    pipe = pipeline(table)
    instance = dg.DagsterInstance.ephemeral()
    job = defs.resolve_job_def("snapshot_job")
    start_kb = _status_kb(os.getpid(), "VmRSS")
    nxt = pipe.decide()
    if nxt.kind != "snapshot" or nxt.trigger != "initial":
        raise RuntimeError(f"expected an initial snapshot, the decision is {nxt}")
    tags = {TABLE_TAG: table, TRIGGER_TAG: nxt.trigger, FROM_TAG: "", TO_TAG: nxt.to_position or ""}
    started = time.monotonic()
    result = job.execute_in_process(partition_key=table, tags=tags, instance=instance, raise_on_error=True)
    job_s = time.monotonic() - started
    meta = result.asset_materializations_for_node("snapshot")[0].metadata
    m = pipe.manifest()
    snap = m.latest_snapshot()
    assert snap is not None and snap.to_position == nxt.to_position
    data = {"rows": snap.row_count, "job_s": job_s, "spark_s": float(meta["spark_s"].value),  # type: ignore[arg-type]
            "build_s": float(meta["duration_s"].value),  # type: ignore[arg-type]
            "driver_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "driver_start_kb": start_kb,
            "driver_end_anon_kb": _status_kb(os.getpid(), "RssAnon"),
            "driver_end_file_kb": _status_kb(os.getpid(), "RssFile"),
            "bytes": {fid: ref.size_bytes for fid, ref in snap.formats.items()}}
    print(RESULT_MARK + json.dumps(data), flush=True)
    return 0


def extrapolation(snaps: Sequence[SnapshotResult]) -> str:
    """What the big size would cost, scaled linearly from the largest measured size: clearly an estimate."""
    rows = max(s.rows for s in snaps)
    scale = BIG_ROWS / rows
    job = next(s.job_s for s in snaps if s.rows == rows) * scale / 60
    staging = next(s.ingest_s for s in snaps if s.rows == rows) * scale / 60
    return (f"{BIG_ROWS:,} rows: not measured in this run (`--big` measures it). EXTRAPOLATION, NOT A MEASUREMENT "
            f"(linear from {rows:,} rows): initial snapshot job ~{job:.0f} min, plus ~{staging:.0f} min to stage "
            "the buffer.")


# ---- report ---------------------------------------------------------------------------------------


def machine_facts() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    java = "java ?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        java = (done.stderr or done.stdout).splitlines()[0].replace('"', "")
    import pyspark

    return (f"{platform.machine()}, {os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB RAM, "
            f"{platform.python_implementation()} {platform.python_version()}, PySpark {pyspark.__version__}, {java}")


def command_line(args: argparse.Namespace) -> str:
    return "benchmarks/pipeline.py" + (" " + " ".join(args.argv) if args.argv else "")


def render(args: argparse.Namespace, fresh: list[FreshnessPhase], snaps: list[SnapshotResult],
           facts: str, elapsed_s: float, notes: list[str]) -> str:
    lines = [
        SECTION,
        "",
        f"Machine: {facts}. Load average (1 min) {load1():.1f} at the end; each row gives its own mean "
        f"(max) over the measurement. Code: commit {os.environ.get(REVISION, 'unknown')}. Produced by "
        f"`{command_line(args)}` in {elapsed_s / 60:.0f} min.",
        "",
    ]
    if fresh:
        lines += [
            f"### Freshness: source commit → manifest head ({args.rate:g} changes/s, diff.interval "
            f"{args.interval:g} s, buffer seal_interval {args.seal_interval:g} s, {args.fresh_rows:,}-row table)",
            "",
            "| runtime (a session per cycle) | diffs | changes | p50 s | p95 s | max s | vs warm (p50 / p95) "
            "| session open s | build s | commit s | load avg |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        warm = next((f for f in fresh if f.mode == "warm"), None)
        for f in fresh:
            ages = f.ages()
            p50, p95 = percentile(ages, 50), percentile(ages, 95)
            ratio = "1.00× / 1.00×" if f is warm or warm is None else (
                f"{p50 / percentile(warm.ages(), 50):.2f}× / {p95 / percentile(warm.ages(), 95):.2f}×")
            name = ("warm: local Spark Connect server, started before, reused" if f.mode == "warm"
                    else "cold: classic local[2] session, new JVM per cycle")
            diffs = sum(c.kind == "diff" for c in f.measured)
            lines.append(f"| {name} | {diffs} | {len(ages):,} | {p50:.1f} | {p95:.1f} | {ages[-1]:.1f} | {ratio} "
                         f"| {f.mean('open_s'):.2f} | {f.mean('build_s'):.2f} | {f.mean('commit_s'):.2f} "
                         f"| {f.load} |")
        lines += [
            "",
            "Freshness of a change = mtime of the manifest object the commit wrote − the wall-clock time the "
            "generator emitted the change's transaction (recorded per commit position on the ingest thread); "
            f"percentiles over every committed change. Both tables are ingested side by side all along and the "
            f"runtimes take turns in {args.blocks} alternating blocks of cycles, so outside load falls on both; the "
            "first diff of every block (the other block's backlog) is a warm-up, not counted. Session, "
            "build (decide + Spark + upload of 3 formats) and commit (manifest CAS, cleanup, buffer release) are "
            "means per cycle. Expected floor: about seal_interval/2 + diff.interval/2 + one cycle; a cycle longer "
            "than diff.interval starts the next at once, so changes then wait up to two cycles. The cold row is a "
            "lower bound of a session per run process: it pays the JVM boot, not interpreter start or imports.",
            "",
        ]
    if snaps:
        lines += [
            "### Snapshot throughput: the initial snapshot's `snapshot_job` (Spark build, upload of jsonl + protobuf "
            "+ parquet, manifest commit) on the warm server",
            "",
            "| rows | job s | rows/s | Spark s | upload s | commit + Dagster s | driver peak RSS "
            "(at start) | server JVM peak RSS | server tree peak PSS | load avg |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in snaps:
            jvm = mib(s.jvm_peak_kb) + ("" if s.jvm_peak_reset else " (since server start)")
            lines.append(f"| {s.rows:,} | {s.job_s:.1f} | {s.rate:,.0f} | {s.spark_s:.1f} "
                         f"| {s.build_s - s.spark_s:.1f} | {s.job_s - s.build_s:.1f} | {mib(s.driver_peak_kb)} "
                         f"({mib(s.driver_start_kb)}) | {jvm} | {mib(s.tree_peak_kb)} | {s.load} |")
        sizes = ", ".join(f"{s.rows:,} rows: " + " / ".join(f"{fid} {b / 1e6:,.0f} MB" for fid, b in s.bytes.items())
                          for s in snaps)
        small, large = min(snaps, key=lambda s: s.rows), max(snaps, key=lambda s: s.rows)
        growth = (f"from {small.rows:,} to {large.rows:,} rows (×{large.rows / small.rows:.0f}) the driver's peak "
                  f"went from {mib(max(s.driver_peak_kb for s in snaps if s.rows == small.rows))} to "
                  f"{mib(max(s.driver_peak_kb for s in snaps if s.rows == large.rows))}, while the jsonl artifact "
                  f"alone is {large.bytes.get('jsonl', 0) / 2**20:,.0f} MiB at {large.rows:,} rows"
                  if large.rows > small.rows else "one size only, so no growth to compare")
        lines += [
            "",
            "Job s is the wall time of `execute_in_process`; Spark s is the build's Spark work (STATE dataset and "
            "staged parts of every format), upload s the rest of the snapshot asset (mostly concatenating the parts "
            "into one object per format on the destination), commit + Dagster s the manifest asset and the run's "
            "bookkeeping. "
            "The driver is the Dagster run process (a fresh child per job; `getrusage` peak, in brackets its RSS "
            "after importing Dagster and the code location, before the run): it plans the Spark job, collects one "
            "report row per staged part and streams the parts into the destination in 1 MiB chunks, so the table "
            f"never passes through it: {growth}. The server JVM peak is VmHWM, reset before each job; the tree adds "
            "the Python workers that encode the formats (proportional set size, so the pages the workers share "
            "with their daemon count once in all, sampled every 0.5 s). The JVM heap is capped by "
            f"spark.driver.memory (4g by default). Artifact sizes: {sizes}.",
            "",
            "The generator describes no columns, like every source but PostgreSQL: its copy is built the way "
            "such a source's is, the parquet schema inferred from the rows by Spark (a pass that parses every "
            "row's JSON), the rows typed by Spark (parsing it again) and bucketed through its shuffle, each row's "
            "protobuf record built from its JSON split into column tokens by Arrow kernels (json_columns.py). A "
            "PostgreSQL copy is encoded by the copy tasks from its column texts instead: the re-base sections' "
            "initial snapshots, whose 1,000,000-row build takes 6-7 s.",
            "",
        ]
    lines += [f"{n}" for n in notes]
    if notes:
        lines.append("")
    return "\n".join(lines)


def write_section(path: Path, section: str) -> None:
    """Replace this benchmark's section of the shared file (or append it), keeping every other section."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == SECTION), None)
    if start is None:
        path.write_text(text.rstrip("\n") + "\n\n" + section)
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    path.write_text("".join(lines[:start]) + section + ("\n" + tail if tail else ""))


# ---- main -----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="a few minutes: 5 cycles, one size of 200,000 rows")
    p.add_argument("--big", action="store_true", help=f"also snapshot {BIG_ROWS:,} rows (long: see the docs)")
    p.add_argument("--sizes", default=None, help="snapshot sizes, comma-separated (default 1000000,3000000)")
    p.add_argument("--cycles", type=int, default=None, help="measured freshness cycles per runtime (default 15)")
    p.add_argument("--blocks", type=int, default=None,
                   help="alternating warm/cold blocks the cycles are split into (default 3)")
    p.add_argument("--rate", type=float, default=200.0, help="source changes per second (default 200)")
    p.add_argument("--interval", type=float, default=5.0, help="diff.interval in seconds (default 5)")
    p.add_argument("--seal-interval", type=float, default=1.0, help="buffer.seal_interval in seconds (default 1)")
    p.add_argument("--fresh-rows", type=int, default=100_000, help="rows of the freshness table (default 100000)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--skip-freshness", action="store_true")
    p.add_argument("--skip-snapshots", action="store_true")
    p.add_argument("--docs", type=Path, default=DOCS, help="the Markdown file to write the section into")
    p.add_argument("--no-docs", action="store_true", help="only print the tables")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    p.add_argument("--snapshot-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(argv)
    args.docs = args.docs.absolute()  # the measuring process runs in another directory
    if args.cycles is None:
        args.cycles = 5 if args.quick else 15
    if args.blocks is None:
        args.blocks = 1 if args.quick else 3
    if not 1 <= args.blocks <= args.cycles:
        p.error("--blocks must be between 1 and --cycles")
    if args.sizes is None:
        args.sizes = "200000" if args.quick else "1000000,3000000"
    args.sizes = [int(s.replace("_", "")) for s in str(args.sizes).split(",") if s]
    if args.big and BIG_ROWS not in args.sizes:
        args.sizes.append(BIG_ROWS)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.snapshot_worker:
        return snapshot_worker()
    # SIGTERM unwinds like Ctrl-C, so every finally below still runs (stops the server, removes files).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if not os.environ.get(FROZEN_CODE):
        return run_frozen(argv)
    return measure(args)


def revision() -> str:
    """The git commit of the working tree (read-only git commands), and whether the packages differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(ROOT), "status", "--porcelain", "--",
                                *PACKAGES], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + (" with uncommitted changes" if dirty else "")) if head else "unknown"


def run_frozen(argv: Sequence[str]) -> int:
    """Copy the project's packages, then measure in a child process that imports only that copy."""
    code = Path(tempfile.mkdtemp(prefix="bench-pipeline-code-"))
    try:
        for package in PACKAGES:
            shutil.copytree(ROOT / package, code / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        path = [str(code), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, FROZEN_CODE: str(code), REVISION: revision(), "PYTHONPATH": os.pathsep.join(path)}
        # cwd = the copy: a classic Spark's Python workers start in the driver's cwd and import from it first.
        child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv], env=env, cwd=code)
        try:
            return child.wait()
        except KeyboardInterrupt:  # the child got the Ctrl-C too and is cleaning up
            child.wait()
            raise
        except BaseException:
            child.terminate()
            child.wait(timeout=300)
            raise
    finally:
        shutil.rmtree(code, ignore_errors=True)


def warm_up(tmp: Path, server_pid: int, seed: int) -> None:
    """A throwaway initial snapshot, so the first measured job finds the server's JIT warm."""
    work = tmp / "warm-up"
    stage_buffer(work, 100_000, seed)
    snapshot_job(work, tmp, server_pid, 100_000)
    shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace) -> int:
    """The benchmark proper (in the process that imports the frozen code)."""
    from snapshot_assets.spark.connect_server import local_server_info, stop_local_connect_server

    started = time.monotonic()
    facts = machine_facts()
    print(f"{facts}\nload average at start: {load1():.1f}", flush=True)
    check_streamed_rows(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    state_dir = tmp / STATE_SUBDIR
    fresh: list[FreshnessPhase] = []
    snaps: list[SnapshotResult] = []
    notes: list[str] = []
    try:
        boot = time.monotonic()
        session = open_session("warm", state_dir)  # the server, started before anything is measured
        check_code(session.spark, "Spark Connect server's Python")
        close_session(session)
        info = local_server_info(state_dir)
        assert info is not None
        print(f"local Spark Connect server pid {info.pid} ready in {time.monotonic() - boot:.1f} s "
              f"(state in {state_dir}); code: commit {os.environ.get(REVISION)}, frozen in "
              f"{os.environ[FROZEN_CODE]}", flush=True)
        if not args.skip_freshness:
            fresh = measure_freshness(tmp, state_dir, args)
        if not args.skip_snapshots:
            if args.skip_freshness:
                print("warming the server up (100,000 rows, not reported) ...", flush=True)
                warm_up(tmp, info.pid, args.seed)
            for rows in args.sizes:
                work = tmp / f"snap-{rows}"
                ingest_s = stage_buffer(work, rows, args.seed)
                print(f"snapshot of {rows:,} rows (buffer staged in {ingest_s:.0f} s, load {load1():.1f}):",
                      flush=True)
                s = snapshot_job(work, tmp, info.pid, rows)
                s.ingest_s = ingest_s
                snaps.append(s)
                print(f"  initial: {s.job_s:6.1f} s, {s.rate:9,.0f} rows/s (Spark {s.spark_s:.1f} s), "
                      f"driver peak {mib(s.driver_peak_kb)} (at the end: anon {mib(s.driver_end_anon_kb)}, "
                      f"file {mib(s.driver_end_file_kb)}), JVM peak {mib(s.jvm_peak_kb)}, tree peak "
                      f"{mib(s.tree_peak_kb)}, load {s.load}", flush=True)
                shutil.rmtree(work / "buffer", ignore_errors=True)
                shutil.rmtree(work / "archive", ignore_errors=True)
            if snaps and BIG_ROWS not in args.sizes:
                notes.append(extrapolation(snaps))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the cleanup finish
        stopped = stop_local_connect_server(state_dir)
        print(f"stopped the local Spark Connect server: {stopped}", flush=True)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    section = render(args, fresh, snaps, facts, time.monotonic() - started, notes)
    print()
    print(section)
    if not args.no_docs:
        write_section(args.docs, section)
        print(f"wrote the section to {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
