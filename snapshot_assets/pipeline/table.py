"""One table's write path: decide the next artifact, build it with Spark, upload it, commit it.

This is what the Dagster assets call (and `snapshotter run --once` through them). Each step is
idempotent: object keys are deterministic, so re-running a step after a crash overwrites the same
objects, and the manifest commit recognises an artifact it already holds.

Working state lives under the working root beside the buffer (`buffer.path`, a local directory or
an S3 prefix: resources/work_storage.py): `_state/<table>/epoch=N` (the STATE
dataset of each snapshot) and `_state/<table>/deltas/epoch=N/<from>-<to>` (each diff's net changes:
with them the state is current at every committed position, the base of the next diff and
snapshot), `_staging/<table>` (scratch datasets of a build), `_outbox/` (undelivered events),
`_metrics/` (counters that outlive the run's process). The driver and every Spark executor reach
them alike (spark/locations.py); the artifact's pieces go from the tasks straight into each
destination's multipart upload (spark/pieces.py), which the driver completes.

S3 destinations and AWS sinks are signed as the credentials profile their spec names
(resources/aws_credentials.py); every destination and sink is wrapped so its failures are counted.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from resources.aws_credentials import CredentialProfiles
from resources.buffer import BufferReader
from resources.destinations.base import Destination
from resources.destinations.factory import build_destination
from resources.sinks.base import EventSink
from resources.sinks.factory import build_sink
from resources.subscribers.errors import KeyMismatch
from resources.table_storage import buffer_storage, work_root
from snapshot_assets.archive import keys
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.manifest import Artifact, Manifest, utc_now
from snapshot_assets.archive.pins import snapshot_pin, with_pin
from snapshot_assets.archive.positions import comparator
from snapshot_assets.archive.reader import artifact_key
from snapshot_assets.archive.versions import VERSIONS, snapshot_versions_key
from snapshot_assets.config import TableConfig
from snapshot_assets.counters import (
    ARTIFACTS_WRITTEN,
    CAS_RETRIES,
    CounterStore,
    CountingDestination,
    CountingSink,
    unwrap,
)
from snapshot_assets.pipeline.commit import (
    CommitResult,
    collect_orphans,
    commit_artifact,
    current_manifest,
    delete_artifacts,
    read_copies,
)
from snapshot_assets.pipeline.decide import NextArtifact, next_artifact
from snapshot_assets.pipeline.outbox import DeliveryReport, Outbox, artifact_event
from snapshot_assets.spark.locations import Location
from snapshot_assets.spark.pieces import Targets

# A multipart upload begun this long ago and never completed is a crashed run's: no build runs a day.
STALE_UPLOAD_S = 24 * 3600.0


@dataclass
class BuildResult:
    artifact: Artifact
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class CommitReport:
    commit: CommitResult
    deleted_objects: int
    orphans: int
    delivery: DeliveryReport
    released_segments: int


class TablePipeline:
    """Everything about one configured table's archive, from its config."""

    def __init__(self, table: TableConfig, *, destinations: Sequence[Destination] | None = None,
                 sinks: Sequence[EventSink] | None = None, profiles: CredentialProfiles | None = None) -> None:
        self.cfg = table
        self.name = table.name
        self.cmp = comparator("lsn")
        self.profiles = profiles if profiles is not None else CredentialProfiles.shared(table.credentials)
        self.work = work_root(table, self.profiles)
        self.counters = CounterStore(self.work.part("_metrics"), self.name)
        built = list(destinations) if destinations is not None else [
            build_destination(d, profiles=self.profiles) for d in table.destinations]
        self.destinations: list[Destination] = [CountingDestination(d, self.counters) for d in built]
        made = list(sinks) if sinks is not None else [
            build_sink(e, client=self.profiles.sink_client) for e in table.events]
        self.sinks: list[EventSink] = [CountingSink(s, self.counters) for s in made]
        self.state_root = self.location(f"_state/{self.name}")
        self.staging = self.location(f"_staging/{self.name}")
        self.outbox = Outbox(self.work.part("_outbox"))

    def location(self, sub: str) -> Location:
        """A place under the working root for Spark's data, reached alike by the driver and every
        executor (a local path, or an S3 prefix whose requests each host signs itself)."""
        return Location.of(self.work.location(sub), self.work.connection)

    # ---- cheap reads (sensors) -----------------------------------------------------------------

    def buffer(self) -> BufferReader:
        return BufferReader(self.cfg.buffer.path, self.name, storage=buffer_storage(self.cfg, self.work))

    def buffer_exists(self) -> bool:
        """Whether the table's buffer was ever written (asked without creating its directory)."""
        return next(iter(self.work.root.list(f"{self.name}/")), None) is not None

    @property
    def key_fields(self) -> tuple[str, ...]:
        """The columns that name this table's rows everywhere downstream: build, readers, checks.

        The key the source reported, as the change buffer recorded it with the durable data. The
        source checked configured `key_fields` against it at start, so a configured key that
        differs here (edited after ingest) stops the build instead of re-keying half an archive.
        With nothing ingested yet (a reader on a host without the buffer): the configured key,
        else laredo's default.
        """
        schema = self.buffer().durable_schema()
        reported = schema.key_fields if schema is not None else ()
        configured = self.cfg.key_fields
        if reported and configured and reported != configured:
            raise KeyMismatch(self.name, configured, reported, "key the source reported",
                              "recorded in the change buffer; restart ingest after changing key_fields")
        return reported or configured or keys.DEFAULT_KEY_FIELDS

    def manifest(self) -> Manifest:
        return current_manifest(read_copies(self.destinations, self.cfg.key_prefix), self.name)

    def decide(self, now: _dt.datetime | None = None, *, force: bool = False,
               diff_size: Any = None) -> NextArtifact:
        """The next artifact by the table's policy; `diff_size` measures the pending diff for the size
        triggers (the sensor's Spark measurement), else they judge the buffer's bytes since the head."""
        m = self.manifest()
        pending = self.buffer().stats(m.head_position or None)
        return next_artifact(m, pending, self.cfg.policy, now or _dt.datetime.now(_dt.UTC), force=force,
                             diff_size=diff_size, snapshot_format=self.cfg.snapshot_formats[0])

    # ---- building (Spark) ----------------------------------------------------------------------

    def build(self, spark: Any, nxt: NextArtifact, *, label: str = "") -> BuildResult:
        """Build `nxt` with Spark and upload every format to every destination (not yet committed).

        Both kinds start from the table at the head: the STATE dataset of the epoch's snapshot plus
        the delta of every committed diff after it (`LayeredBase`); whatever part of that chain is
        missing here (a lost working directory) is made up from the previous snapshot artifact and
        the buffer segments since it. A diff completes its row images against that base, a
        snapshot applies the changes since the head to it. Nothing is committed here, so a failure
        (an unfillable value among them, named with the table) leaves the archive as it was.
        A snapshot given a `label` (a user's), and a table's first snapshot, carry their pin.
        """
        from snapshot_assets.spark.images import UnfillableValue

        try:
            return self._build(spark, nxt, label)
        except UnfillableValue as exc:
            raise UnfillableValue(f"table {self.name}: {exc}") from exc

    def _build(self, spark: Any, nxt: NextArtifact, label: str) -> BuildResult:
        from snapshot_assets.spark.assemble import assemble
        from snapshot_assets.spark.bases import choose_base
        from snapshot_assets.spark.diff import build_diff
        from snapshot_assets.spark.snapshot import build_snapshot

        if nxt.kind not in ("snapshot", "diff") or nxt.to_position is None:
            raise ValueError(f"nothing to build for {self.name} ({nxt.kind})")
        m = self.manifest()
        reader = self.buffer()
        self.staging.clear()
        key_fields = self.key_fields
        previous = m.latest_snapshot()
        state = self._state_at_head(m)
        artifact = self._artifact_base(previous)
        s3 = self.work.connection  # signs the tasks' reads of a buffer in S3
        if nxt.kind == "diff":
            if nxt.from_position != m.head_position or previous is None:
                raise ValueError(f"{self.name}: the diff starts at {nxt.from_position}, the head is {m.head_position}")
            epoch = m.epoch
            targets = Targets(tuple(self.destinations), self.cfg.key_prefix, epoch)
            base = self.diff_base(spark, m, self.staging / "_catch_up", state=state, artifact=artifact)
            built = build_diff(spark, reader.segments(m.head_position, nxt.to_position), base, nxt.to_position,
                               key_fields, self.cfg.diff_formats, self.staging,
                               self._delta_dir(epoch, m.head_position, nxt.to_position),
                               state_formats=self.cfg.snapshot_formats, schema=self._row_schema(nxt.to_position),
                               targets=targets, buffer_s3=s3)
        else:
            epoch = m.epoch + 1
            targets = Targets(tuple(self.destinations), self.cfg.key_prefix, epoch)
            base, segments = choose_base(reader, nxt.to_position, state=state, artifact=artifact, cmp=self.cmp,
                                         buffer_s3=s3, records="protobuf" in self.cfg.snapshot_formats)
            built = build_snapshot(spark, base, segments, nxt.to_position, key_fields,
                                   self.cfg.snapshot_formats, self.staging, self.state_root / f"epoch={epoch}",
                                   previous_keys=self._reusable_objects(previous, state),
                                   bucket_bytes=self.cfg.bucket_bytes, schema=self._row_schema(nxt.to_position),
                                   targets=targets, buffer_s3=s3)
        refs = assemble(built, self.destinations, self.cfg.key_prefix, epoch)
        self.staging.clear()
        snap = nxt.kind == "snapshot"
        art = Artifact(kind=nxt.kind, epoch=epoch, from_position=nxt.from_position, to_position=nxt.to_position,
                       created_at=utc_now(), formats=refs, row_count=built.count if snap else 0,
                       change_count=0 if snap else built.count)
        if snap:
            art = with_pin(art, snapshot_pin(m, label, art.created_at))
        return BuildResult(art, built.seconds, dict(built.details))

    def diff_base(self, spark: Any, m: Manifest, scratch: Location, *, state: Any = None, artifact: Any = None) -> Any:
        """The table at the head, the base a diff from the head completes its images against: the
        state (STATE dataset + committed deltas), or the previous snapshot artifact, caught up
        through the buffer where the state stops. The diff build and its size measurement share it."""
        from snapshot_assets.spark.bases import FrameBase, choose_base
        from snapshot_assets.spark.effects import window_partitions
        from snapshot_assets.spark.window import advance

        if state is None:
            state = self._state_at_head(m)
        if artifact is None:
            artifact = self._artifact_base(m.latest_snapshot())
        base, catch_up = choose_base(self.buffer(), m.head_position, state=state, artifact=artifact, cmp=self.cmp,
                                     buffer_s3=self.work.connection, records=False)
        if catch_up:
            table, _ = advance(spark, base, catch_up, self.key_fields, partitions=window_partitions(spark, catch_up),
                               scratch=scratch, s3=self.work.connection)
            base = FrameBase(table, m.head_position, base.describe())
        return base

    def _delta_dir(self, epoch: int, from_position: str, to_position: str) -> Location:
        """Where the state's step for the diff (from, to] of `epoch` lives (one path per diff)."""
        return self.state_root / "deltas" / f"epoch={epoch}" / f"{keys.san(from_position)}-{keys.san(to_position)}"

    def _state_at_head(self, m: Manifest) -> Any:
        """The newest snapshot's STATE dataset plus the deltas of the committed diffs after it, as far
        as they are all here (a `LayeredBase`), or None when the snapshot's state itself is not."""
        from snapshot_assets.spark.bases import DeltaSet, LayeredBase
        from snapshot_assets.spark.state import StateBase

        snap = m.latest_snapshot()
        if snap is None:
            return None
        state = StateBase.load(self.state_root / f"epoch={snap.epoch}")
        if state is None or state.position != snap.to_position:
            return None  # left by a snapshot attempt that was never committed: not the base
        deltas = []
        for art in m.artifacts[m.artifacts.index(snap) + 1:]:
            delta = DeltaSet.load(self._delta_dir(art.epoch, art.from_position or "", art.to_position))
            if art.kind != "diff" or delta is None:
                break
            deltas.append(delta)
        return LayeredBase(state, tuple(deltas))

    def _reusable_objects(self, previous: Artifact | None, state: Any) -> dict[str, str]:
        """Per format made of bucket pieces (the byte formats, the versions object, parquet), the
        previous snapshot's object key when every destination holds it whole and it was built from
        `state` (its buckets' bytes, in order): the ranges a re-base copies."""
        from snapshot_assets.archive.row_schema import RowSchema
        from snapshot_assets.spark import parquet_pieces
        from snapshot_assets.spark.parquet_artifact import PARQUET_FORMAT, snapshot_arrow_schema
        from snapshot_assets.spark.state import piece_formats

        if previous is None or state is None or state.state.position != previous.to_position:
            return {}
        buckets = state.state.buckets
        found: dict[str, str] = {}
        pieced = [*piece_formats(state.state.formats), *[f for f in state.state.formats if f == PARQUET_FORMAT]]
        for fid in pieced:
            if fid == VERSIONS:  # the versions object beside the snapshot (not a format of it)
                key = snapshot_versions_key(self.cfg.key_prefix, previous.epoch, previous.to_position)
            elif fid in previous.formats:
                key = artifact_key(self.cfg.key_prefix, previous, FORMATS[fid])
            else:
                continue
            size = sum(b.sizes.get(fid, 0) for b in buckets)
            if fid == PARQUET_FORMAT:  # the bodies with the magic and the merged footer around them
                size = parquet_pieces.object_size([b.sizes.get(fid, 0) for b in buckets], [b.footer for b in buckets],
                                                  snapshot_arrow_schema(state.state.schema or RowSchema.of(())))
            if all(any(o.key == key and o.size == size for o in d.list(key)) for d in self.destinations):
                found[fid] = key
        return found

    def _artifact_base(self, previous: Artifact | None) -> Any:
        """The previous snapshot's objects as a Spark base, read in place: from a destination whose
        URIs are `file://` (Spark reads them as they are) or `s3://` (the tasks read them with the
        destination's connection: this Spark has no hadoop-aws). An archive whose STATE dataset is
        gone re-bases from it."""
        from snapshot_assets.spark.bases import ArtifactBase

        fid = next((f for f in ("parquet", "jsonl", "protobuf") if previous and f in previous.formats), None)
        if previous is None or fid is None:
            return None
        key = artifact_key(self.cfg.key_prefix, previous, FORMATS[fid])
        for dest in self.destinations:
            uri, connection = dest.uri(key), getattr(unwrap(dest), "connection", None)
            if uri.startswith("file://") or (uri.startswith("s3://") and connection is not None):
                paths = [dest.uri(o.key) for o in dest.list(key + "/")] or [uri]  # (old archives: parquet folders)
                return ArtifactBase(tuple(paths), fid, previous.to_position, connection)
        return None

    # ---- committing ----------------------------------------------------------------------------

    def commit(self, art: Artifact) -> CommitReport:
        """Commit, then clean up and notify; failures after the commit never undo it."""
        result = commit_artifact(self.destinations, self.cfg.key_prefix, self.name, art, cmp=self.cmp,
                                 keep_epochs=self.cfg.keep_epochs, grace=self.cfg.retention_grace,
                                 columns=self._columns(art))
        self.counters.add(CAS_RETRIES, amount=result.cas_retries)
        if not result.already_committed:
            self.counters.add(ARTIFACTS_WRITTEN, art.kind)
        deleted = delete_artifacts(self.destinations, self.cfg.key_prefix, result.pruned)
        orphans = sum(len(collect_orphans(d, self.cfg.key_prefix, result.manifest))
                      + len(d.abort_stale_uploads(self.cfg.key_prefix, STALE_UPLOAD_S)) for d in self.destinations)
        self._prune_state(result.manifest)
        manifest_uri = self.destinations[0].uri(keys.manifest_key(self.cfg.key_prefix))
        self.outbox.enqueue(artifact_event(self.name, art, result.manifest.head_position, manifest_uri), self.sinks)
        delivery = self.outbox.deliver(self.sinks)
        released = self._release_buffer(result.manifest)
        return CommitReport(result, deleted, orphans, delivery, released)

    def _row_schema(self, position: str) -> Any:
        """The parquet columns of the rows at `position` from the source's own description (a
        PostgreSQL table's columns); None for sources that describe nothing (inferred from the rows)."""
        from snapshot_assets.archive.row_schema import RowSchema

        columns = self._columns_at(position)
        return None if columns is None else RowSchema.from_manifest_columns(columns)

    def _columns(self, art: Artifact) -> list[dict[str, Any]] | None:
        """The manifest's `columns` for a PostgreSQL source: the table as the source described the
        rows through `art` (the buffer keeps that per segment), so a schema change reaches the
        manifest with the snapshot it forced. None (keep what the manifest has) for other sources,
        whose servers describe the table themselves, or when the buffer no longer holds it."""
        return self._columns_at(art.to_position)

    def _columns_at(self, position: str) -> list[dict[str, Any]] | None:
        if self.cfg.source.type != "postgres":
            return None
        schema = self.buffer().schema_at(position)
        return None if schema is None else [column.definition() for column in schema.columns]

    def settle(self, art: Artifact) -> bool:
        """Finish the post-commit work of `art` if the manifest holds it although its run failed.

        An ambiguous manifest write (the connection died, the write landed later) fails the run that
        made it, yet commits the artifact; its event would never be sent. The next artifact step
        calls this with the run's leftover record: True when `art` is committed (events and cleanup
        are done now), False when it is not (the record is stale and may be dropped).
        """
        if not any((a.kind, a.epoch, a.to_position) == (art.kind, art.epoch, art.to_position)
                   for a in self.manifest().artifacts):
            return False
        self.commit(art)
        self.counters.add(ARTIFACTS_WRITTEN, art.kind)
        return True

    def _prune_state(self, m: Manifest) -> None:
        """Keep only the STATE dataset of the newest snapshot, the bucket files it names and the
        deltas of its epoch (the head)."""
        from snapshot_assets.spark.state import prune_state

        prune_state(self.state_root, m.epoch)

    def _release_buffer(self, m: Manifest) -> int:
        """Ask the buffer to drop segments the archive no longer needs: those before the newest snapshot.

        Changes after the newest snapshot stay, because the next snapshot is built from that
        snapshot plus them. The buffer's writer (the ingest process) does the deletion.
        """
        snap = m.latest_snapshot()
        if snap is None:
            return 0
        return self.buffer().release_below(snap.to_position)
