"""A diff's net changes encoded in one pass (diff_records.py) are the single-process writers' bytes.

The oracle is the formats' own writers (`JsonlDiffWriter`, `ProtobufDiffWriter`) and
`snapshot_record`, fed the changes decoded from the same Go-JSON texts the pass reads; generated
changes cover inserts, updates and deletes, empty and key-only images, keys past 2^53, composite
keys, strings Go escapes and nested values; the pass is the function each task runs. Last, a diff
built by Spark on a state whose rows kept their records, under REPLICA IDENTITY DEFAULT.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resources.subscribers.generator import KEY_FIELDS as GEN_KEY
from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.errors import EncodeError
from snapshot_assets.archive.formats import get_format
from snapshot_assets.archive.formats.jsonl import MAX_LINE_BYTES, diff_line
from snapshot_assets.archive.formats.protobuf import snapshot_record
from snapshot_assets.archive.keys import key_json, laredo_row_key, typed_key
from snapshot_assets.spark.bases import choose_base
from snapshot_assets.spark.diff import build_diff
from snapshot_assets.spark.diff_records import RECORD_COLUMNS, _encode, record_formats
from snapshot_assets.spark.effects import decode_row
from snapshot_assets.spark.snapshot import build_snapshot
from tests.spark.conftest import ALL_FORMATS, generate, python_bytes, read_parts, staged_bytes

KEY = ("tenant", "id")
_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=6)
_SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | _TEXT
            | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(["<&>", "a\u2028b", '"q"']))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=2),
                       max_leaves=5)
_KEYS = st.tuples(_TEXT.filter(bool), st.integers(-(2**64), 2**64))


@st.composite
def _changes(draw: Any) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None, tuple[str, int]]:
    tenant, ident = draw(_KEYS)
    action = draw(st.sampled_from(["INSERT", "UPDATE", "DELETE"]))

    def row() -> dict[str, Any]:
        return {"tenant": tenant, "id": ident, **draw(st.dictionaries(_TEXT.filter(lambda t: t not in KEY), _VALUES,
                                                                      max_size=4))}

    old = None if action == "INSERT" else draw(st.sampled_from(["row", "key-only", "empty"]))
    old_image = {"row": row, "key-only": lambda: {"tenant": tenant, "id": ident}, "empty": dict}[old]() if old else None
    new_image = None if action == "DELETE" else row()
    return action, old_image, new_image, (tenant, ident)


def _batch(changes: list[Any]) -> pa.RecordBatch:
    def text(image: dict[str, Any] | None) -> str | None:
        return None if image is None else gojson.encode_row(image, lambda: "k")

    rows = [(key_json(typed_key(dict(zip(KEY, k, strict=True)), KEY)), action,
             laredo_row_key(new if new is not None else old or dict(zip(KEY, k, strict=True)), KEY),
             text(old), text(new), "0/1\t\tC") for action, old, new, k in changes]
    names = ("key", "action", "change_key", "old", "new", "ver")
    columns = [pa.array(c, pa.string()) for c in zip(*rows, strict=True)]
    # old_pb: the base's record of `old`, as images.complete_befores hands it on (a stored row's)
    records = [None if o is None or i % 2 else snapshot_record(decode_row(text(o)) or {}, KEY)
               for i, (_, o, _, _) in enumerate(changes)]
    return pa.RecordBatch.from_arrays([*columns, pa.array(records, pa.binary())], names=[*names, "old_pb"])


def _written(format_id: str, changes: list[Change]) -> bytes:
    out = io.BytesIO()
    writer = get_format(format_id).diff_writer(out, KEY)
    for change in changes:
        writer.write(change)
    writer.close()
    return out.getvalue()


@settings(max_examples=150, deadline=None)
@given(st.lists(_changes(), min_size=1, max_size=8))
def test_the_pass_writes_what_the_writers_write(changes: list[Any]) -> None:
    batch = _batch(changes)
    out = _encode(batch, KEY, True, ("jsonl", "protobuf"))
    decoded = [Change(Change.parse_action(a), k, decode_row(o), decode_row(n)) for a, k, o, n in zip(
        *(batch.column(c).to_pylist() for c in ("action", "change_key", "old", "new")), strict=True)]
    # jsonl splices the images' texts (Go's `-0` stays `-0`, which a decoded row would lose).
    texts = zip(batch.column("old").to_pylist(), batch.column("new").to_pylist(), strict=True)
    assert out.column(RECORD_COLUMNS["jsonl"]).to_pylist() == [diff_line(c, KEY, *t) for c, t in zip(decoded, texts,
                                                                                                      strict=True)]
    if not any("-0" in (t or "") for t in batch.column("new").to_pylist() + batch.column("old").to_pylist()):
        assert b"".join(out.column(RECORD_COLUMNS["jsonl"]).to_pylist()) == _written("jsonl", decoded)
    assert b"".join(out.column(RECORD_COLUMNS["protobuf"]).to_pylist()) == _written("protobuf", decoded)
    assert out.column("pb").to_pylist() == [None if c.new is None else snapshot_record(c.new, KEY) for c in decoded]
    assert out.schema.names == [*batch.schema.names, "sk", "pb", "dj", "dpb"]


def test_a_key_past_2_53_is_a_double_in_jsonl_and_its_digits_in_protobuf() -> None:
    """The two formats' keys differ for a snowflake id: the protobuf key is not the jsonl key reused."""
    ident = 2**62 + 7
    change = ("UPDATE", {"tenant": "x", "id": ident, "v": 1}, {"tenant": "x", "id": ident, "v": 2}, ("x", ident))
    out = _encode(_batch([change]), KEY, True, ("jsonl", "protobuf"))
    assert b'"key":"[x 4.611686018427388e+18]"' in out.column("dj")[0].as_py()
    assert f"[x {ident}]".encode() in out.column("dpb")[0].as_py()


def test_only_the_asked_records_are_made() -> None:
    batch = _batch([("UPDATE", {"tenant": "a", "id": 2**60 + 1, "v": 1}, {"tenant": "a", "id": 2**60 + 1, "v": 2},
                     ("a", 2**60 + 1))])
    out = _encode(batch, KEY, False, ("jsonl",))
    assert out.schema.names == [*batch.schema.names, "sk", "pb", "dj"]
    assert out.column("pb").null_count == 1
    assert out.column("dj").to_pylist() == [_written("jsonl", [Change(Action.UPDATE, "", *(
        decode_row(batch.column(c)[0].as_py()) for c in ("old", "new")))])]
    assert record_formats(["parquet", "protobuf", "jsonl"]) == ("protobuf", "jsonl")


def test_an_over_long_new_image_is_refused_naming_its_row() -> None:
    big = {"tenant": "t", "id": 7, "blob": "x" * MAX_LINE_BYTES}
    with pytest.raises(EncodeError, match="16 MiB") as caught:
        _encode(_batch([("INSERT", None, big, ("t", 7))]), KEY, True, ("jsonl", "protobuf"))
    assert "[t 7]" in str(caught.value)


def test_a_diff_on_a_state_reuses_the_base_rows_records_and_writes_the_writers_bytes(spark: Any,
                                                                                    tmp_path: Path) -> None:
    """REPLICA IDENTITY DEFAULT: the before-images come from the state, with their stored protobuf
    records (`old_pb`), and the protobuf diff is still exactly the writer's for the changes the
    jsonl diff holds (snowflake ids among the generator's keys)."""
    g = generate(tmp_path / "buffer", 5, identity="default", changes=600)
    cut, end = g.boundaries[len(g.boundaries) // 2], g.boundaries[-1]
    base, segments = choose_base(g.reader, cut)
    state = build_snapshot(spark, base, segments, cut, GEN_KEY, ALL_FORMATS, tmp_path / "s0",
                           tmp_path / "state" / "epoch=1").details["state"]
    built = build_diff(spark, g.reader.segments(cut, end), state, end, GEN_KEY, ("jsonl", "protobuf"),
                       tmp_path / "d", tmp_path / "delta", state_formats=ALL_FORMATS)
    delta = pq.read_table(tmp_path / "delta", columns=["action", "old_pb"])
    reused = pc.sum(pc.is_valid(delta.column("old_pb"))).as_py()
    assert reused and reused == pc.sum(pc.not_equal(delta.column("action"), "INSERT")).as_py()
    changes = read_parts(built.formats["jsonl"], "diff")
    assert staged_bytes(built.formats["protobuf"]) == python_bytes("protobuf", "diff", changes)
