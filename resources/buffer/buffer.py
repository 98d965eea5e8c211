"""The change buffer's writer: subscriber events in, sealed transaction-aligned segments out.

Crash safety (kill -9 anywhere, restart: nothing lost, nothing applied twice):
- Durable means sealed: a segment is fsynced and atomically published before anything depends on
  it, and only whole transactions are ever sealed (a seal happens at a TxEnd or a ResyncEnd).
- `durable_position()` is the end of the last sealed transaction. The ingest loop acknowledges
  only that to the source and resumes from it after a restart, so everything after it is sent
  again — and everything after it was, by construction, never sealed: no loss, no duplicate.
- Unsealed data is only in memory or in temporaries; a crash loses it harmlessly (the source
  re-sends it) and recovery deletes the temporaries. A crash between publishing a segment and
  rewriting the index is repaired at open: the segment describes itself and is adopted
  (see `index.py`). Seqs are assigned from the durable state, so re-sent changes get the same
  seqs they would have had: the total order has no gaps and no repeats.
- Every check on an event (position order, encodability) runs before the event changes anything,
  so a refused event leaves the buffer exactly as it was.

One writer per table (an exclusive lock taken at open); one thread drives it (the ingest loop).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from resources.buffer.batch import OpenBatch, OpenResync, SealTarget
from resources.buffer.errors import BadChange, BadEventOrder, PositionWentBackwards, RangeNotAvailable
from resources.buffer.index import (
    IndexState,
    ResyncInProgress,
    load_index,
    read_release,
    releasable,
    without_segments,
)
from resources.buffer.reader import BufferView
from resources.buffer.segments import SegmentMeta, encode_change
from resources.buffer.storage import BufferStorage, local_table_storage
from resources.subscribers.events import (
    ChangeEvent,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotBatch,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from snapshot_assets.archive.errors import ArchiveError

log = logging.getLogger(__name__)

DEFAULT_SEAL_INTERVAL_S = 1.0
DEFAULT_SEAL_CHANGES = 100_000
DEFAULT_ROW_GROUP_ROWS = 65_536


class ChangeBuffer(BufferView):
    """The durable change buffer of one table (writer side).

    `append` every subscriber event in order; changes accumulate in the open batch and are sealed
    at a transaction end once `seal_interval` seconds passed since the batch opened or it holds
    `seal_changes` changes (`seal()` forces it, `seal_if_due()` lets an idle loop honour the
    interval). Read-side questions (`durable_position`, `segments`, `stats`, `latest_resync`) come
    from `BufferView`. Storage is `<root>/<table>/` unless a `BufferStorage` is given.
    """

    def __init__(self, root: str | Path, table: str, *, ordering: str = "lsn",
                 seal_interval: float = DEFAULT_SEAL_INTERVAL_S, seal_changes: int = DEFAULT_SEAL_CHANGES,
                 row_group_rows: int = DEFAULT_ROW_GROUP_ROWS, storage: BufferStorage | None = None) -> None:
        if seal_interval < 0 or seal_changes < 1 or row_group_rows < 1:
            raise ValueError("seal_interval must be >= 0, seal_changes and row_group_rows >= 1")
        super().__init__(table, ordering, storage or local_table_storage(root, table))
        self.seal_interval = seal_interval
        self.seal_changes = seal_changes
        self._row_group_rows = row_group_rows
        self._storage.lock_writer()
        try:
            self._index, self.recovery = load_index(self._storage, table, ordering, repair=True)
        except BaseException:
            self._storage.unlock_writer()
            raise
        self._schema: TableSchema | None = self._index.schema
        self._keyed_schema: TableSchema | None = None
        self._schema_keys: tuple[str, ...] = ()
        self._batch = OpenBatch(self._storage, self._index.next_seq, row_group_rows)
        self._resync: OpenResync | None = None
        self._last_tx = self._index.durable_position  # the last TxEnd accepted (sealed or open)
        self._last_change: str | None = None  # the last positioned change of the open transaction
        self._opened_at: float | None = None  # monotonic time the open batch got its first event
        self._seal_requested = False
        self._closed = False
        self._honour_release()  # requests made while no writer was running

    def __enter__(self) -> ChangeBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _state(self) -> IndexState:
        return self._index

    # --- appending -------------------------------------------------------------------------

    def append(self, event: Event) -> bool:
        """Add one subscriber event. Returns True when it made more of the stream durable.

        Raises (leaving the buffer unchanged) PositionWentBackwards, BadEventOrder or BadChange.
        """
        match event:
            case ChangeEvent():
                return self._change(event)
            case TxEnd():
                return self._tx_end(event)
            case SnapshotRow():
                self._snapshot_row(event)
                return False
            case SnapshotBatch():
                self._snapshot_row(event)
                return False
            case SchemaEvent():
                self._set_schema(event.schema)
                return False
            case ResyncBegin():
                return self._resync_begin(event)
            case ResyncEnd():
                return self._resync_end(event)
        raise BadEventOrder(f"table {self.table}: not a subscriber event: {event!r}")

    def _where(self) -> str:
        return f"table {self.table}"

    def _require_valid(self, position: str, what: str) -> None:
        if self._cmp(position, "") <= 0:  # every comparator sorts unparseable positions lowest, like ""
            raise BadEventOrder(f"{self._where()}: {what} position {position!r} is not a valid "
                                f"{self.ordering} position")

    def _require_after(self, position: str, what: str) -> None:
        """`position` must be after the last transaction end and not before the transaction's changes."""
        self._require_valid(position, what)
        if self._last_tx is not None and self._cmp(position, self._last_tx) <= 0:
            raise PositionWentBackwards(f"{self._where()}: {what} at {position} is not after {self._last_tx}, "
                                        "the last transaction end the buffer holds; nothing was written")
        if self._last_change is not None and self._cmp(position, self._last_change) < 0:
            raise PositionWentBackwards(f"{self._where()}: {what} at {position} is before {self._last_change}, "
                                        "an earlier change of the same transaction; nothing was written")

    def _key_fields(self, what: str) -> tuple[str, ...]:
        schema = self._schema
        if schema is None:
            raise BadEventOrder(f"{self._where()}: {what} before any SchemaEvent")
        if schema is not self._keyed_schema:  # asked once per change: derive the key once per schema
            self._keyed_schema, self._schema_keys = schema, schema.key_fields
        return self._schema_keys

    def _require_stream(self, what: str) -> tuple[str, ...]:
        if self._resync is not None:
            raise BadEventOrder(f"{self._where()}: {what} arrived during a re-sync (before its ResyncEnd)")
        return self._key_fields(what)

    def _touch(self) -> None:
        if self._opened_at is None:
            self._opened_at = time.monotonic()

    def _set_schema(self, schema: TableSchema) -> None:
        if schema.table != self.table:
            raise BadEventOrder(f"{self._where()}: the source describes table {schema.table!r}")
        if not schema.key_fields:
            raise BadEventOrder(f"{self._where()}: the table has no primary key; a change buffer needs one "
                                "to identify rows")
        self._schema = schema

    def _change(self, event: ChangeEvent) -> bool:
        key_fields = self._require_stream("a change")
        # A source entry without a position belongs to the next boundary; a change at the same
        # position as the previous one (same transaction) was already checked.
        if event.position and event.position != self._last_change:
            self._require_after(event.position, "change")
        try:
            row, keys = encode_change(event, self._batch.next_seq, key_fields)
        except ArchiveError as exc:
            raise BadChange(f"{self._where()}: {exc}") from exc
        self._touch()
        self._batch.add(row, keys)
        if event.position:
            self._last_change = event.position
        return self._spill() if self._batch.tail_full else False

    def _spill(self) -> bool:
        """An oversized transaction: seal what is complete, then stream the rest to disk."""
        sealed = False
        if not self._batch.spilled and self._batch.committed_rows:
            sealed = self._seal_committed()
        self._batch.spill_tail()
        return sealed

    def _tx_end(self, event: TxEnd) -> bool:
        self._require_stream("a transaction end")
        if not event.position:
            raise BadEventOrder(f"{self._where()}: a transaction end must carry a position")
        self._require_after(event.position, "transaction end")
        self._touch()
        self._batch.commit(event.position)
        self._last_tx, self._last_change = event.position, None
        if self._seal_requested or self._due():
            return self._seal_open()
        return False

    def _snapshot_row(self, event: SnapshotRow | SnapshotBatch) -> None:
        if self._resync is None:
            raise BadEventOrder(f"{self._where()}: a snapshot row outside a re-sync")
        key_fields = self._key_fields("a snapshot row")
        try:
            if isinstance(event, SnapshotBatch):
                self._resync.add_batch(event, key_fields)
            else:
                self._resync.add(event, key_fields)
        except ArchiveError as exc:
            raise BadChange(f"{self._where()}: {exc}") from exc

    def _resync_begin(self, event: ResyncBegin) -> bool:
        sealed = False
        if self._resync is not None:  # the source restarted its snapshot: start over
            self._resync.discard()
        else:
            sealed = self._seal_open()
            self._batch.discard()  # a partial transaction is superseded by the snapshot
            self._seal_requested = False
        durable = self._index.durable_position
        self._resync = OpenResync(self._index.next_seq, self._row_group_rows, durable, event.reason)
        self._last_tx, self._last_change = durable, None
        self._index.resync_in_progress = ResyncInProgress(durable, event.reason, self._resync.started_at)
        self._write_index()
        return sealed

    def _resync_end(self, event: ResyncEnd) -> bool:
        if self._resync is None:
            raise BadEventOrder(f"{self._where()}: a re-sync end without a re-sync")
        if not event.position:
            raise BadEventOrder(f"{self._where()}: a re-sync end must carry a position")
        self._require_valid(event.position, "re-sync end")
        # A re-sync may end at the durable position itself (nothing happened in between, by the
        # source's own positions); it then describes the state a diff from there starts from.
        durable = self._index.durable_position
        if durable is not None and self._cmp(event.position, durable) < 0:
            raise PositionWentBackwards(f"{self._where()}: re-sync end {event.position} is before the durable "
                                        f"position {durable}; nothing was written")
        if event.row_count != self._resync.rows:
            raise BadEventOrder(f"{self._where()}: the re-sync announced {event.row_count} rows but "
                                f"{self._resync.rows} arrived")
        resync, self._resync = self._resync, None
        try:
            meta = resync.seal(self._storage, self._target(), event.position)
        except BaseException:
            resync.discard()
            self._index.resync_in_progress = None
            raise
        self._index.resync_in_progress = None
        self._commit_segment(meta)
        self._batch = OpenBatch(self._storage, self._index.next_seq, self._row_group_rows)
        self._last_tx, self._last_change = event.position, None
        return True

    # --- sealing ---------------------------------------------------------------------------

    def _due(self) -> bool:
        if self._batch.committed_rows >= self.seal_changes:
            return True
        return self._opened_at is not None and time.monotonic() - self._opened_at >= self.seal_interval

    def seal(self) -> bool:
        """Seal every complete transaction now; returns True if the durable position advanced.

        During a re-sync, or while a transaction larger than a row group is still arriving, the
        seal happens at the next boundary instead (a sealed segment never holds a partial one).
        """
        if self._resync is not None:
            return False
        return self._seal_open()

    def seal_if_due(self) -> bool:
        """Seal if the seal interval has passed: for a loop whose source has gone quiet."""
        return self._resync is None and self._due() and self._seal_open()

    def _seal_open(self) -> bool:
        batch = self._batch
        if batch.spilled:
            self._seal_requested = True
            return False
        if batch.committed_rows:
            return self._seal_committed()
        durable = self._index.durable_position
        if batch.to_position is None or (durable is not None and self._cmp(batch.to_position, durable) <= 0):
            return False
        # Transactions without changes for this table: the position advances, no segment is
        # needed (the gap holds nothing), and the source may release what it kept for us.
        self._index.durable_position = batch.to_position
        batch.to_position = None
        self._write_index()
        self._sealed()
        return True

    def _target(self) -> SealTarget:
        return SealTarget(self._index.next_segment, self._index.durable_position, self.table, self._schema)

    def _seal_committed(self) -> bool:
        started = time.time()
        try:
            meta = self._batch.seal(self._target())
        except BaseException:
            self.rollback()
            raise
        durable_at = time.time()
        self._index.metrics.record(durable_at - (meta.first_arrival or started), durable_at - started)
        self._commit_segment(meta)
        self._sealed()
        return True

    def _commit_segment(self, meta: SegmentMeta) -> None:
        self._index.add_segment(meta, self._cmp)
        self._index.schema = self._schema
        self._write_index()

    def _sealed(self) -> None:
        self._seal_requested = False
        self._opened_at = time.monotonic() if self._batch.has_tail else None
        self._honour_release()

    def _honour_release(self) -> None:
        """Apply a `BufferReader.release_below` request, if one is newer than the last truncation.

        Retention is never worth stopping ingest for: a failure is logged and retried next seal.
        """
        below = read_release(self._storage)
        durable = self._index.durable_position
        if below is None or durable is None:
            return
        if self._index.low_water is not None and self._cmp(below, self._index.low_water) <= 0:
            return
        if self._cmp(below, durable) > 0:
            below = durable
        try:
            self.truncate_below(below)
        except OSError as exc:
            log.warning("%s: releasing buffer segments below %s failed (retried at the next seal): %s",
                        self._where(), below, exc)

    def _write_index(self) -> None:
        self._index.write(self._storage)

    # --- recovery, retention, shutdown -----------------------------------------------------

    def rollback(self) -> None:
        """Forget everything not durable; the source re-sends it from `durable_position()`.

        Used before reconnecting to a source (it resumes from the durable position, so anything
        still open would otherwise be appended twice) and on shutdown after the final seal.
        """
        if self._resync is not None:
            self._resync.discard()
            self._resync = None
        if self._index.resync_in_progress is not None:
            self._index.resync_in_progress = None
            self._write_index()
        self._batch.discard()
        self._schema = self._index.schema  # a schema announced after the last seal is re-announced
        self._last_tx, self._last_change = self._index.durable_position, None
        self._opened_at = None
        self._seal_requested = False

    def truncate_below(self, committed_position: str) -> list[str]:
        """Delete the segments wholly at or below a committed artifact's position; returns their names.

        The newest segment is always kept: it carries the durable position and the next seq, so
        even a lost index is rebuilt without re-snapshotting. The index is rewritten before any
        file is deleted, so a crash in between leaves only unreferenced leftovers, which recovery
        recognises (numbered below the index's range) and deletes instead of adopting.
        """
        durable = self._index.durable_position
        if durable is None or self._cmp(committed_position, durable) > 0:
            raise RangeNotAvailable(f"{self._where()}: cannot truncate below {committed_position}: only "
                                    f"{durable} is durable")
        doomed = set(releasable(self._index, committed_position, self._cmp))
        low_water = self._index.low_water
        if low_water is None or self._cmp(committed_position, low_water) > 0:
            low_water = committed_position
        state = without_segments(self._index, doomed)
        state.low_water = low_water
        state.write(self._storage)
        self._index = state
        for name in sorted(doomed):
            self._storage.delete(name)
        return sorted(doomed)

    def close(self) -> None:
        """Seal what is complete, drop the rest, release the writer lock."""
        if self._closed:
            return
        self._closed = True
        try:
            self.seal()
        finally:
            self.rollback()
            self._storage.unlock_writer()
