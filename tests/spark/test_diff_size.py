"""The measured size of a diff equals the bytes the real writers write for it, without writing it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from resources.buffer import ChangeBuffer
from resources.subscribers.events import Event, TxEnd
from resources.subscribers.generator import KEY_FIELDS, GeneratorSubscriber
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.keys import laredo_row_key
from snapshot_assets.archive.policy import Policy
from snapshot_assets.config import parse_config
from snapshot_assets.pipeline.decide import NextArtifact, next_artifact
from snapshot_assets.pipeline.diff_size import SparkDiffSize
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.spark.bases import EmptyBase
from snapshot_assets.spark.diff import build_diff
from snapshot_assets.spark.diff_size import encoded_diff_bytes
from snapshot_assets.spark.effects import NET_DDL, default_partitions, encode_row
from snapshot_assets.spark.window import net_window
from tests.spark.conftest import ALL_FORMATS, TABLE, generate, python_bytes

# Every character class Go's quoting treats differently: plain, two-byte escapes, \u00XX escapes
# (controls and the HTML-safe <>&), U+2028/U+2029, multi-byte UTF-8 that is written as is.
NASTY = 'q"uo\\te\n\r\t\x08\x0c \x00\x01\x0b\x1f <a&b> \u2028\u2029 é 東 😀'


def hard_changes() -> list[Change]:
    big = 2**53 + 1
    base: Row = {"id": 1, "name": NASTY, "score": 1e21, "small": 1e-7, "tags": {"k": [NASTY, None, True]},
                 "balance": -(2**63), "email": None}
    return [
        Change(Action.INSERT, "", None, {**base, "id": 1_000_000}),
        Change(Action.UPDATE, "", {**base, "id": big}, {**base, "id": big, "name": "plain"}),
        Change(Action.DELETE, "", {"id": 7}, None),  # a DEFAULT-identity DELETE: the key only
        Change(Action.UPDATE, "", {}, {**base, "id": 8}),  # an empty before-image: left out
        Change(Action.INSERT, "", None, {"id": NASTY, "name": ""}),  # a string key that needs escapes
        Change(Action.DELETE, "", {**base, "id": -0.5}, None),
    ]


def net_frame(spark: Any, changes: list[Change]) -> Any:
    """NET_DDL rows for `changes`, as the window's fold makes them (Go-JSON images, laredo's key)."""
    rows = []
    for c in changes:
        image = c.new if c.new is not None else c.old
        key = laredo_row_key(image, KEY_FIELDS)
        rows.append((key, c.action.value, key, None if c.old is None else encode_row(c.old, KEY_FIELDS),
                     None if c.new is None else encode_row(c.new, KEY_FIELDS), None, None))
    return spark.createDataFrame(rows, NET_DDL).repartition(3)


@pytest.mark.parametrize("truncated", [False, True])
def test_measured_bytes_equal_the_writers_on_hard_values(spark: Any, truncated: bool) -> None:
    changes = hard_changes()
    written = ([Change(Action.TRUNCATE)] if truncated else []) + changes
    net = net_frame(spark, changes)
    for fid in ("jsonl", "protobuf"):
        assert encoded_diff_bytes(net, truncated, fid, KEY_FIELDS) == len(python_bytes(fid, "diff", written)), fid


def test_an_empty_window_measures_zero(spark: Any) -> None:
    empty = spark.createDataFrame([], NET_DDL)
    assert encoded_diff_bytes(empty, False, "jsonl", KEY_FIELDS) == 0
    assert encoded_diff_bytes(empty, False, "protobuf", KEY_FIELDS) == 0


@pytest.mark.slow
@pytest.mark.parametrize("seed, truncate", [(11, 0.0), (12, 0.01)])
def test_measured_window_equals_the_built_diff(spark: Any, tmp_path: Path, seed: int, truncate: float) -> None:
    """The real window (buffer segments -> net_window) measures what build_diff then writes, per format."""
    g = generate(tmp_path / "buffer", seed, truncate=truncate, pk_change=0.1)
    lo, hi = g.boundaries[3], g.boundaries[-1]
    window = net_window(spark, g.reader.segments(lo, hi), EmptyBase(lo), KEY_FIELDS,
                        partitions=default_partitions(spark), scratch=tmp_path / "measure")
    built = build_diff(spark, g.reader.segments(lo, hi), EmptyBase(lo), hi, KEY_FIELDS, ALL_FORMATS,
                       tmp_path / "staging", tmp_path / "delta")
    assert window.truncated == built.truncated
    if truncate:
        assert built.truncated, "the seed should put a TRUNCATE into the window"
    for fid in ("jsonl", "protobuf"):
        assert encoded_diff_bytes(window.net, window.truncated, fid, KEY_FIELDS) == built.formats[fid].bytes, fid
    # parquet: one file per task here against one object in the archive, so only an estimate
    assert encoded_diff_bytes(window.net, window.truncated, "parquet", KEY_FIELDS) > 0


def users_pipeline(work: Path, diff_formats: str) -> TablePipeline:
    return TablePipeline(parse_config(f"""
snapshotter {{
  source {{ type = laredo, server = "localhost:4002", table = users }}
  destinations = [ {{ type = local, path = "{work / 'archive'}" }} ]
  formats {{ snapshot = [jsonl], diff = {diff_formats} }}
  buffer.path = "{work / 'buffer'}"
}}
""", env={}).tables[0])


def append(work: Path, events: Sequence[Event]) -> None:
    with ChangeBuffer(work / "buffer", TABLE, seal_interval=3600.0, seal_changes=200) as buffer:
        for event in events:
            buffer.append(event)
        buffer.seal()


@pytest.mark.slow
def test_the_pipeline_measures_its_pending_diff_as_the_build_then_writes_it(spark: Any, tmp_path: Path) -> None:
    """REPLICA IDENTITY DEFAULT changes after a committed snapshot: the measurement completes the
    images against the state at the head like the build, so it equals the diff written, in the
    primary format (the first of formats.diff), and the size trigger fires at exactly that size."""
    gen = GeneratorSubscriber(TABLE, seed=31, rows=120, changes=700, identity="default", pk_change=0.1,
                              tx_size=(1, 6), hot_keys=0.2, hot_share=0.6)
    events = list(gen.events(None))
    ends = [i for i, e in enumerate(events) if isinstance(e, TxEnd)]
    cut = ends[len(ends) // 3] + 1
    append(tmp_path, events[:cut])
    pipe = users_pipeline(tmp_path, "[jsonl, protobuf]")
    initial = pipe.decide()
    assert (initial.kind, initial.trigger) == ("snapshot", "initial")
    pipe.commit(pipe.build(spark, initial).artifact)
    append(tmp_path, events[cut:])

    head, durable = pipe.manifest().head_position, pipe.buffer().durable_position()
    assert durable is not None and durable != head
    measured = {fid: SparkDiffSize(spark, users_pipeline(tmp_path, f"[{fid}, jsonl]"))(head, durable)
                for fid in ("jsonl", "protobuf")}
    built = pipe.build(spark, NextArtifact("diff", "test", head, durable)).artifact
    assert measured == {fid: built.formats[fid].size_bytes for fid in ("jsonl", "protobuf")}
    assert not Path(pipe.location(f"_measure/{pipe.name}").uri).exists(), "the scratch space is removed"

    m, pending = pipe.manifest(), pipe.buffer().stats(head)
    now = dt.datetime.now(dt.UTC)
    for threshold, kind in ((measured["jsonl"], "snapshot"), (measured["jsonl"] + 1, "diff")):
        nxt = next_artifact(m, pending, Policy(max_diff_bytes=threshold), now, diff_size=SparkDiffSize(spark, pipe))
        assert nxt.kind == kind, threshold
