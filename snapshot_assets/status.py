"""`snapshotter status`: where every table's archive stands, from cheap reads only.

Per table: the manifest (epoch, head) read from EVERY destination separately, so one unreachable
destination shows up as that destination's error instead of hiding the others; the buffer index
(durable position, what is pending since the head); the source's own position where it can say
(PostgreSQL: the server's current WAL position) and the lag behind it; churn and age of the last
snapshot; what the re-base trigger would decide now; the outbox; the persisted counters; and
health. A table is READY once its first snapshot is committed and its ingest is alive: a process
holds the buffer's writer lock (the table's Dagster ingest run or `snapshotter ingest`: a local
buffer's flock or an S3 buffer's lease, read without taking it), or the table's own Dagster
ingest run is in progress (runs tagged `snapshotter/ingest_table`; another table's run says
nothing about this one). With a Dagster instance, a table whose ingest or artifact runs keep
failing says so: how many in a row, the last run's error, and when the sensors try again
(snapshot_assets/run_history.py).

The same collection feeds the Prometheus exporter (metrics.py) and the manifest's metadata.
Nothing here writes anything, and no failure of one table or destination stops the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from resources.destinations.base import DestinationError
from snapshot_assets.archive import keys
from snapshot_assets.archive.errors import ArchiveError
from snapshot_assets.archive.manifest import Manifest
from snapshot_assets.archive.positions import parse_lsn
from snapshot_assets.config import TableConfig
from snapshot_assets.counters import Values, destination_label
from snapshot_assets.pipeline.commit import current_manifest, read_copies
from snapshot_assets.pipeline.decide import next_artifact, parse_time, trigger_state
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.redaction import redact
from snapshot_assets.run_history import INGEST_JOB, failure_message, failure_streak, in_progress, last_ended
from snapshot_assets.tables import INGEST_TABLE_TAG, TABLE_TAG


@dataclass
class DestinationHealth:
    destination: str
    ok: bool
    detail: str  # the manifest's revision, "no manifest yet", or the error


@dataclass
class TableStatus:
    table: str
    ready: bool = False
    not_ready: list[str] = field(default_factory=list)
    epoch: int | None = None
    head_position: str | None = None
    artifacts: int | None = None
    last_snapshot_position: str | None = None
    last_diff_at: str | None = None
    last_diff_position: str | None = None
    diffs_since_snapshot: int | None = None  # the diffs a reader replays after the newest snapshot
    durable_position: str | None = None
    source_position: str | None = None
    source_position_from: str = ""  # "pg_current_wal_lsn" | "buffer" | ""
    source_lag: int | None = None  # bytes of WAL (LSN sources)
    buffered_changes: int | None = None
    buffered_bytes: int | None = None
    churn_since_snapshot: int | None = None
    last_snapshot_at: str | None = None
    snapshot_age_s: float | None = None
    decision: str = ""
    outbox_depth: int = 0
    ingest_alive: bool = False
    ingest: str = ""
    ingest_failures: int = 0  # the table's failed ingest runs in a row (the supervisor relaunches it)
    artifact_failures: int = 0  # the table's failed artifact runs in a row (the trigger retries)
    artifact_retry: str = ""  # the last of those failures and the retry it waits for
    destinations: list[DestinationHealth] = field(default_factory=list)
    counters: Values = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- the parts -------------------------------------------------------------------------------------


def _manifest(pipe: TablePipeline, status: TableStatus) -> Manifest | None:
    """The current manifest from the readable copies; each destination's health on the way."""
    key = keys.manifest_key(pipe.cfg.key_prefix)
    copies = []
    for dest in pipe.destinations:
        label = destination_label(dest)
        try:
            (copy,) = read_copies([dest], pipe.cfg.key_prefix)
        except (DestinationError, ArchiveError, OSError) as e:
            status.destinations.append(DestinationHealth(label, False, str(e)))
            continue
        copies.append(copy)
        detail = f"{key} revision {copy.revision}" if copy.revision else "no manifest yet"
        status.destinations.append(DestinationHealth(label, True, detail))
    if not copies:
        status.errors.append("no destination could be read")
        return None
    try:
        return current_manifest(copies, pipe.name)
    except ArchiveError as e:
        status.errors.append(str(e))
        return None


def _chain(m: Manifest, status: TableStatus) -> None:
    """The newest snapshot and diff of the manifest, and how many diffs follow that snapshot."""
    status.epoch, status.head_position, status.artifacts = m.epoch, m.head_position, len(m.artifacts)
    snap = m.latest_snapshot()
    if snap is not None:
        status.last_snapshot_position = snap.to_position
        status.diffs_since_snapshot = sum(not a.is_snapshot for a in m.artifacts[m.artifacts.index(snap) + 1:])
    last_diff = next((a for a in reversed(m.artifacts) if not a.is_snapshot), None)
    if last_diff is not None:
        status.last_diff_at, status.last_diff_position = last_diff.created_at, last_diff.to_position


def source_position(table: TableConfig) -> str | None:
    """The source's current position where it can tell: PostgreSQL's WAL position (None otherwise)."""
    if table.source.type != "postgres":
        return None
    import psycopg2

    with contextlib.closing(psycopg2.connect(table.source.dsn, connect_timeout=3)) as conn, conn.cursor() as cur:
        cur.execute("SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
                    "ELSE pg_current_wal_lsn() END)::text")
        row = cur.fetchone()
    return str(row[0]) if row and row[0] else None


def lag_bytes(source: str | None, durable: str | None) -> int | None:
    """How far (bytes of WAL) the buffer is behind the source; None when positions are not LSNs."""
    s, d = parse_lsn(source or ""), parse_lsn(durable or "")
    if s is None:
        return None
    return max(0, s - (d or 0))


def outbox_depth(pipe: TablePipeline) -> int:
    """Undelivered events of this table (the outbox is shared by the tables of a buffer root)."""
    return sum(record["event"].get("table") == pipe.name for _, record in pipe.outbox.records())


def _ingest(pipe: TablePipeline, instance: dg.DagsterInstance | None, status: TableStatus) -> tuple[bool, str]:
    """Whether the table's ingest is alive, and why (or why not, with the last failure's error)."""
    holder = pipe.buffer().writer_holder()
    if holder is not None:
        return True, f"{holder} holds the buffer writer lock"
    if instance is None:
        return False, "no process holds the buffer writer lock"
    tags = {INGEST_TABLE_TAG: pipe.name}
    run = in_progress(instance, tags, INGEST_JOB)
    if run is not None:
        return True, f"ingest run {run.run_id} is {run.status.value}"
    streak = failure_streak(instance, tags, INGEST_JOB)
    status.ingest_failures = streak.failures
    if streak.last is not None:
        failed = streak.last.dagster_run.run_id
        return False, (f"the ingest run {failed} failed ({streak.failures} in a row): "
                       f"{failure_message(instance, failed)}; {_due(streak.retry_due(pipe.cfg.retry), 'relaunch')}")
    last = last_ended(instance, tags, INGEST_JOB)
    if last is not None:
        return False, f"no process holds the buffer writer lock; the last ingest run {last.dagster_run.run_id} " \
                      f"ended {last.dagster_run.status.value}"
    return False, "no process holds the buffer writer lock; no ingest run yet"


def _due(at: float, what: str) -> str:
    wait = at - _dt.datetime.now(_dt.UTC).timestamp()
    return f"{what} due in {wait:.0f}s" if wait > 0 else f"{what} due now"


def _artifact_failures(pipe: TablePipeline, instance: dg.DagsterInstance | None, status: TableStatus) -> None:
    """The table's failed artifact runs in a row, and the retry the trigger will request."""
    if instance is None:
        return
    streak = failure_streak(instance, {TABLE_TAG: pipe.name})
    status.artifact_failures = streak.failures
    if streak.last is not None:
        failed = streak.last.dagster_run.run_id
        status.artifact_retry = (f"run {failed} failed ({streak.failures} in a row): "
                                 f"{failure_message(instance, failed)}; "
                                 f"{_due(streak.retry_due(pipe.cfg.retry), 'retry')}")


def _buffer(pipe: TablePipeline, m: Manifest | None, status: TableStatus, now: _dt.datetime) -> None:
    if not pipe.buffer_exists():
        status.errors.append("the change buffer does not exist yet (nothing ingested)")
        return
    try:
        stats = pipe.buffer().stats((m.head_position if m else None) or None)
    except FileNotFoundError:
        status.errors.append("the change buffer has no index yet (nothing sealed)")
        return
    except Exception as e:  # a corrupt index must not hide the rest of the status
        status.errors.append(f"change buffer: {e}")
        return
    status.durable_position = stats.durable_position
    status.buffered_changes, status.buffered_bytes = stats.changes, stats.bytes
    if m is None:
        return
    snap = m.latest_snapshot()
    if snap is not None:
        status.churn_since_snapshot = trigger_state(m, stats, now).churn_records
        status.last_snapshot_at = snap.created_at
        created = parse_time(snap.created_at)
        status.snapshot_age_s = round((now - created).total_seconds(), 3) if created else None
    nxt = next_artifact(m, stats, pipe.cfg.policy, now, snapshot_format=pipe.cfg.snapshot_formats[0])
    status.decision = "none" if nxt.kind == "none" else f"{nxt.kind} ({nxt.trigger}) to {nxt.to_position}"


def _source(pipe: TablePipeline, status: TableStatus) -> None:
    try:
        position = source_position(pipe.cfg)
    except Exception as e:  # psycopg2 errors and the like: reported, not fatal
        status.errors.append(f"source position: {str(e).strip()}")
        position = None
    if position is not None:
        status.source_position, status.source_position_from = position, "pg_current_wal_lsn"
    elif status.durable_position is not None:
        status.source_position, status.source_position_from = status.durable_position, "buffer"
    status.source_lag = lag_bytes(status.source_position, status.durable_position)


def table_status(pipe: TablePipeline, *, instance: dg.DagsterInstance | None = None,
                 now: _dt.datetime | None = None) -> TableStatus:
    """The status of one table (never raises for what it observes; failures land in `errors`)."""
    now = now or _dt.datetime.now(_dt.UTC)
    status = TableStatus(pipe.name)
    m = _manifest(pipe, status)
    if m is not None:
        _chain(m, status)
    _buffer(pipe, m, status, now)
    _source(pipe, status)
    status.outbox_depth = outbox_depth(pipe)
    status.counters = pipe.counters.read()
    status.ingest_alive, status.ingest = _ingest(pipe, instance, status)
    _artifact_failures(pipe, instance, status)
    if m is None or m.latest_snapshot() is None:
        why = "no snapshot committed yet" if m is not None else "the manifest cannot be read"
        status.not_ready.append(f"{why} (the last {status.artifact_retry})" if status.artifact_retry else why)
    if not status.ingest_alive:
        status.not_ready.append(f"ingest is not running: {status.ingest}")
    status.ready = not status.not_ready
    return _redacted(status)


def _redacted(status: TableStatus) -> TableStatus:
    """The status with every free text redacted: they quote drivers, clients and servers, and the
    status goes everywhere (the CLI, metrics, Dagster metadata)."""
    status.errors = [redact(e) for e in status.errors]
    status.not_ready = [redact(r) for r in status.not_ready]
    status.ingest = redact(status.ingest)
    status.destinations = [dataclasses.replace(d, detail=redact(d.detail)) for d in status.destinations]
    return status


def statuses(pipes: Iterable[TablePipeline], *, instance: dg.DagsterInstance | None = None) -> list[TableStatus]:
    return [table_status(p, instance=instance) for p in pipes]


# ---- rendering ---------------------------------------------------------------------------------------


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _value(v: Any) -> str:
    return "-" if v is None or v == "" else str(v)


def render(items: Sequence[TableStatus]) -> str:
    """A human-readable block per table (`--output table`)."""
    out = []
    for s in items:
        rows = [
            ("epoch / head", f"{_value(s.epoch)} / {_value(s.head_position)} ({_value(s.artifacts)} artifacts)"),
            ("source", f"{_value(s.source_position)} ({s.source_position_from or 'unknown'}), "
                       f"lag {_bytes(s.source_lag)}"),
            ("buffer", f"durable {_value(s.durable_position)}, pending {_value(s.buffered_changes)} changes / "
                       f"{_bytes(s.buffered_bytes)}"),
            ("last snapshot", f"{_value(s.last_snapshot_at)} ({_age(s.snapshot_age_s)} ago), churn since "
                              f"{_value(s.churn_since_snapshot)}"),
            ("trigger now", _value(s.decision)),
            ("outbox", f"{s.outbox_depth} undelivered event(s)"),
            ("ingest", ("alive: " if s.ingest_alive else "DOWN: ") + s.ingest),
        ]
        if s.artifact_retry:
            rows.append(("artifact runs", f"FAILING: {s.artifact_retry}"))
        rows += [("destination", f"{d.destination} {'ok' if d.ok else 'ERROR'}: {d.detail}") for d in s.destinations]
        rows += [("counters", ", ".join(f"{m}{'{' + k + '}' if k else ''}={v:g}" for m, labels in
                                        sorted(s.counters.items()) for k, v in sorted(labels.items())) or "none")]
        rows += [("error", e) for e in s.errors]
        head = f"{s.table}  {'READY' if s.ready else 'NOT READY: ' + '; '.join(s.not_ready)}"
        out.append(head + "\n" + "\n".join(f"  {k:<14} {v}" for k, v in rows))
    return "\n\n".join(out) + "\n"


def render_json(items: Sequence[TableStatus]) -> str:
    return json.dumps({"tables": [s.to_json() for s in items]}, indent=2, sort_keys=False) + "\n"


def dagster_home_instance() -> dg.DagsterInstance | None:
    """The persistent Dagster instance when DAGSTER_HOME is set (to see ingest runs), else None."""
    return dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else None
