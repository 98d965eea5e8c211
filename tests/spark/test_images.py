"""REPLICA IDENTITY DEFAULT on Spark: unchanged out-of-line values and before-images are completed
from the archive's own previous images, and the state stays current at every committed position.

The generator's `identity="default"` sends changes the way PostgreSQL does under the default
replica identity (DELETE: key columns only; UPDATE: no old row, unchanged `email`/`tags` omitted
and named in `unchanged`, also across primary-key changes), while its model keeps the complete
rows: `table_at(P)` is the oracle. Every diff is built on the layered state (snapshot STATE +
the deltas of the diffs before it), like the pipeline does.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from resources.buffer import ChangeBuffer
from resources.subscribers.events import (
    ChangeEvent,
    Column,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from resources.subscribers.generator import KEY_FIELDS
from snapshot_assets.archive.algebra import apply
from snapshot_assets.archive.changes import Action
from snapshot_assets.archive.keys import typed_key
from snapshot_assets.config import parse_config
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.spark.bases import EmptyBase, LayeredBase, StateBase, choose_base
from snapshot_assets.spark.diff import build_diff
from snapshot_assets.spark.images import UnfillableValue
from snapshot_assets.spark.snapshot import build_snapshot
from tests.buffer.helpers import read_refs
from tests.spark.conftest import ALL_FORMATS, by_key, generate, read_parts

ROW_FORMATS = ("jsonl", "parquet")  # protobuf turns integers beyond 2^53 into strings (its mapping)


@pytest.mark.slow
def test_default_identity_diffs_and_snapshots_equal_the_source(spark: Any, tmp_path: Path) -> None:
    g = generate(tmp_path / "buffer", 23, identity="default", pk_change=0.2, truncate=0.002, changes=1800)
    b = g.boundaries
    # Three windows over the whole stream: the second diff is built on a layer of one delta, the
    # third on two (what stacking deltas needs), with the fills and moves of all 1,800 changes.
    cuts = [b[i * len(b) // 3] for i in range(3)] + [b[-1]]
    base, segments = choose_base(g.reader, cuts[0])
    first = build_snapshot(spark, base, segments, cuts[0], KEY_FIELDS, ALL_FORMATS, tmp_path / "s0",
                           tmp_path / "state" / "epoch=1")
    state: StateBase = first.details["state"]
    layered = LayeredBase(state, ())
    sent = read_refs(g.reader.segments(cuts[0], cuts[-1]))
    omitted = [r for r in sent if r["unchanged"]]
    moved = [r for r in omitted if r["old"] is not None]  # key changes: the image comes from the old key
    assert len(omitted) > 100 and moved, "the seed must exercise fills and primary-key moves"
    for i, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        built = build_diff(spark, g.reader.segments(lo, hi), layered, hi, KEY_FIELDS, ALL_FORMATS,
                           tmp_path / f"d{i}", tmp_path / "deltas" / f"d{i}")
        before, after = g.gen.table_at(lo), g.gen.table_at(hi)
        for fid in ROW_FORMATS:
            changes = read_parts(built.formats[fid], "diff")
            for c in changes:
                if c.old is not None:  # the complete row as of `from`, never the key-only image
                    assert c.old == before[typed_key(c.old, KEY_FIELDS)], (fid, lo, c)
            table = {} if built.truncated else dict(before)
            apply(table, [c for c in changes if c.action is not Action.TRUNCATE], KEY_FIELDS)
            assert table == after, (fid, lo, hi)
        layered = LayeredBase(state, (*layered.deltas, built.details["delta"]))
        assert layered.position == hi
        assert by_key([_row(r["row"]) for r in layered.frame(spark, KEY_FIELDS).collect()]) == after
    # A snapshot from the layered state (the head) equals the source.
    end = b[-1]
    snap = build_snapshot(spark, layered, [], end, KEY_FIELDS, ALL_FORMATS, tmp_path / "s1",
                          tmp_path / "state" / "epoch=2")
    for fid in ROW_FORMATS:
        assert by_key(read_parts(snap.formats[fid], "snapshot")) == g.gen.table_at(end), fid


def _row(text: str) -> dict[str, Any]:
    from snapshot_assets.spark.effects import decode_row

    row = decode_row(text)
    assert row is not None
    return row


def test_a_value_with_no_earlier_image_fails_naming_key_column_and_position(spark: Any, tmp_path: Path) -> None:
    """An archive whose base lacks the rows (it never held them): nothing to fill from."""
    g = generate(tmp_path / "buffer", 5, identity="default", pk_change=0.0, changes=300, rows=40)
    lo, hi = g.boundaries[0], g.boundaries[-1]
    with pytest.raises(UnfillableValue, match=r"key \[\d+\] columns \[.*\] at position [0-9A-F]+/[0-9A-F]{8}"):
        build_diff(spark, g.reader.segments(lo, hi), EmptyBase(lo), hi, KEY_FIELDS, ALL_FORMATS,
                   tmp_path / "staging", tmp_path / "delta")


def test_the_pipeline_names_the_table_and_commits_nothing(spark: Any, tmp_path: Path) -> None:
    """A source that sends an UPDATE omitting a value of a row the archive never held (it started
    after the row was written): the build fails naming table, key, column and position; no manifest."""
    table = "public.accounts"
    schema = TableSchema(table, (Column("user_id", "bigint", False, primary_key=True, ordinal=1, primary_key_ordinal=1),
                                 Column("name", "text", ordinal=2), Column("bio", "text", ordinal=3)))
    pipe = TablePipeline(parse_config(f"""
snapshotter {{
  source {{ type = laredo, server = "localhost:4002", table = accounts }}
  destinations = [ {{ type = local, path = "{tmp_path / 'archive'}" }} ]
  buffer.path = "{tmp_path / 'buffer'}"
}}
""", env={}).tables[0])
    with ChangeBuffer(tmp_path / "buffer", table) as buf:
        for event in (SchemaEvent(schema), ResyncBegin("initial load"),
                      SnapshotRow({"user_id": 1, "name": "a", "bio": "x" * 9000}), ResyncEnd("0/10", 1),
                      ChangeEvent("0/20", Action.UPDATE, new={"user_id": 1, "name": "b"}, unchanged=("bio",)),
                      ChangeEvent("0/20", Action.UPDATE, new={"user_id": 2, "name": "c"}, unchanged=("bio",)),
                      TxEnd("0/20")):
            buf.append(event)
        buf.seal()
    nxt = pipe.decide()
    assert nxt.kind == "snapshot" and nxt.to_position == "0/20"
    named = r"^table public\.accounts: .* key \[2\] columns \['bio'\] at position 0/20"
    with pytest.raises(UnfillableValue, match=named):
        pipe.build(spark, nxt)
    assert not pipe.manifest().artifacts
