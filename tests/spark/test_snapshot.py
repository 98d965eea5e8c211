"""The Spark snapshot equals the fold of the previous state with the changes since, from every base."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from resources.subscribers.generator import KEY_FIELDS
from snapshot_assets.archive.algebra import TableState, apply
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.spark.bases import ArtifactBase, Base, BufferSnapshotBase, EmptyBase, StateBase, choose_base
from snapshot_assets.spark.parts import BuiltArtifact
from snapshot_assets.spark.snapshot import build_snapshot
from tests.spark.conftest import (
    ALL_FORMATS,
    Generated,
    by_key,
    frames,
    generate,
    python_bytes,
    read_parts,
    staged_bytes,
    window_changes,
)


def fold(previous: TableState, g: Generated, from_position: str, to_position: str) -> TableState:
    """The oracle: the previous state with the buffer's changes in (from, to] applied in order."""
    state = dict(previous)
    apply(state, window_changes(g.reader, from_position, to_position), KEY_FIELDS)
    return state


def check_snapshot(spark: Any, g: Generated, base: Base, to_position: str, expected: TableState,
                   work: Path) -> BuiltArtifact:
    assert base.position is not None
    segments = g.reader.segments(base.position, to_position) if base.position != to_position else []
    built = build_snapshot(spark, base, segments, to_position, KEY_FIELDS, ALL_FORMATS, work / "staging",
                           work / "state")
    assert built.count == len(expected)
    assert by_key(read_parts(built.formats["jsonl"], "snapshot")) == expected
    rows = list(expected.values())
    for fid in ("jsonl", "protobuf"):  # (c) each line / message is the Python writer's bytes
        assert sorted(frames(staged_bytes(built.formats[fid]), fid)) == \
            sorted(frames(python_bytes(fid, "snapshot", rows), fid)), fid
    python_parquet = FORMATS["parquet"].read_snapshot(io.BytesIO(python_bytes("parquet", "snapshot", rows)))
    assert by_key(read_parts(built.formats["parquet"], "snapshot")) == by_key(list(python_parquet))
    state = built.details["state"]
    assert isinstance(state, StateBase) and state.rows == len(expected) and state.position == to_position
    return built


@pytest.mark.parametrize("seed, truncate", [(21, 0.0), (22, 0.01)])
def test_snapshot_chain_from_every_base(spark: Any, tmp_path: Path, seed: int, truncate: float) -> None:
    """Initial load -> snapshot 1; then snapshot 2 from the STATE dataset and from each artifact format."""
    g = generate(tmp_path / "buffer", seed, truncate=truncate)
    b = g.boundaries
    first, second = b[len(b) // 3], b[-1]
    base1, segments1 = choose_base(g.reader, first)
    assert isinstance(base1, BufferSnapshotBase) and base1.position == g.resyncs[0]
    assert segments1 == g.reader.segments(g.resyncs[0], first)
    initial = by_key([r for r in g.gen.table_at(g.resyncs[0]).values()])
    expected1 = fold(initial, g, g.resyncs[0], first)
    assert expected1 == g.gen.table_at(first)  # the oracle agrees with the generator's own model
    snap1 = check_snapshot(spark, g, base1, first, expected1, tmp_path / "s1")

    expected2 = fold(expected1, g, first, second)
    assert expected2 == g.gen.table_at(second)
    state = StateBase.load(tmp_path / "s1" / "state")
    assert state is not None and state.position == first
    chosen, _ = choose_base(g.reader, second, state=state, artifact=ArtifactBase((), "jsonl", first))
    assert chosen == state  # the state dataset is preferred when it matches the artifact
    truncated = check_snapshot(spark, g, state, second, expected2, tmp_path / "from-state").truncated
    assert truncated == (truncate > 0), "seed 22's second window holds a TRUNCATE, seed 21's none"
    for fid in ALL_FORMATS:
        whole = tmp_path / f"snapshot1.{fid}"  # the object the staged pieces make, as a destination holds it
        whole.write_bytes(staged_bytes(snap1.formats[fid]))
        artifact = ArtifactBase((str(whole),), fid, first)
        # the previous state is what the artifact holds: protobuf turns integers beyond 2^53 into strings
        previous = by_key(read_parts(snap1.formats[fid], "snapshot"))
        check_snapshot(spark, g, artifact, second, fold(previous, g, first, second), tmp_path / f"from-{fid}")


def test_resync_resets_the_base(spark: Any, tmp_path: Path) -> None:
    g = generate(tmp_path / "buffer", 31, resync_every=40, changes=900)
    assert len(g.resyncs) >= 3
    to = g.boundaries[-1]
    stale = StateBase("unused", g.resyncs[1], 0, KEY_FIELDS)  # a snapshot older than the last re-sync
    base, segments = choose_base(g.reader, to, state=stale)
    assert isinstance(base, BufferSnapshotBase) and base.position == g.resyncs[-1]
    assert segments == g.reader.segments(g.resyncs[-1], to)
    check_snapshot(spark, g, base, to, g.gen.table_at(to), tmp_path / "snap")


def test_snapshot_exactly_at_the_base_and_empty_tables(spark: Any, tmp_path: Path) -> None:
    g = generate(tmp_path / "buffer", 41, rows=40, changes=50)
    base, segments = choose_base(g.reader, g.resyncs[0])
    assert segments == []
    check_snapshot(spark, g, base, g.resyncs[0], g.gen.table_at(g.resyncs[0]), tmp_path / "at-base")
    built = build_snapshot(spark, EmptyBase(), [], "0/10", KEY_FIELDS, ALL_FORMATS, tmp_path / "e", tmp_path / "es")
    assert built.count == 0 and not built.formats["jsonl"].parts and not built.formats["protobuf"].parts
    assert read_parts(built.formats["parquet"], "snapshot") == []  # one valid parquet file without rows


def test_choose_base_refuses_what_it_cannot_build(tmp_path: Path) -> None:
    g = generate(tmp_path / "buffer", 51, rows=5, changes=30, resync_every=4)
    with pytest.raises(ValueError, match="after the requested snapshot position"):
        choose_base(g.reader, g.boundaries[0])  # the last re-sync is later than that
