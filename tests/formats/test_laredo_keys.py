"""laredo's own reader agrees with every archive this project writes, per format.

Golden vectors state, per format, the row laredo's Go reader decodes from a snapshot and the key it
derives (RowKey, spec section 6); the diff this project writes for the same row must carry exactly
that key, or laredo's fold keeps the old row as a ghost. Then a whole archive (snowflake ids,
primary-key changes, deletes, a TRUNCATE) written with the project's writer is rebuilt with an
independent model of laredo's reader (`laredo_go`) at every committed position and compared with
the source table as that format's reader sees it.
"""

from __future__ import annotations

import io
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from resources.destinations.local import LocalDestination
from snapshot_assets.archive.algebra import collapse
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.keys import laredo_row_key, typed_key
from snapshot_assets.archive.manifest import Artifact
from snapshot_assets.archive.positions import comparator
from snapshot_assets.archive.writer import ArtifactWriter
from snapshot_assets.pipeline.commit import commit_artifact
from tests.formats import laredo_go

BIG = 2**53 + 1  # the smallest integer a double cannot hold
SNOWFLAKE = 1_790_000_000_000_000_001  # ~1.8e18, like Twitter/Discord ids

# row, key fields, then per format: (the row as laredo's reader decodes it, the key it derives)
GOLDEN: list[tuple[Row, tuple[str, ...], dict[str, tuple[dict[str, Any], str]]]] = [
    ({"id": 42, "name": "a"}, ("id",), {
        "jsonl": ({"id": 42.0, "name": "a"}, "42"),
        "protobuf": ({"id": 42.0, "name": "a"}, "42"),
        "parquet": ({"id": 42, "name": "a"}, "42"),
    }),
    ({"id": 1000000}, ("id",), {
        "jsonl": ({"id": 1e6}, "1e+06"),
        "protobuf": ({"id": 1e6}, "1e+06"),
        "parquet": ({"id": 1000000}, "1000000"),
    }),
    ({"id": 2**53}, ("id",), {  # the last integer a double holds exactly
        "jsonl": ({"id": 9007199254740992.0}, "9.007199254740992e+15"),
        "protobuf": ({"id": 9007199254740992.0}, "9.007199254740992e+15"),
        "parquet": ({"id": 2**53}, "9007199254740992"),
    }),
    ({"id": BIG}, ("id",), {  # the issue's ghost row: protobuf holds the decimal string
        "jsonl": ({"id": 9007199254740992.0}, "9.007199254740992e+15"),
        "protobuf": ({"id": "9007199254740993"}, "9007199254740993"),
        "parquet": ({"id": BIG}, "9007199254740993"),
    }),
    ({"id": -SNOWFLAKE}, ("id",), {
        "jsonl": ({"id": -1.79e18}, "-1.79e+18"),
        "protobuf": ({"id": "-1790000000000000001"}, "-1790000000000000001"),
        "parquet": ({"id": -SNOWFLAKE}, "-1790000000000000001"),
    }),
    ({"tenant": "acme", "id": 1000000}, ("tenant", "id"), {
        "jsonl": ({"tenant": "acme", "id": 1e6}, "[acme 1e+06]"),
        "protobuf": ({"tenant": "acme", "id": 1e6}, "[acme 1e+06]"),
        "parquet": ({"tenant": "acme", "id": 1000000}, "[acme 1000000]"),
    }),
    ({"tenant": "acme", "id": SNOWFLAKE}, ("tenant", "id"), {
        "jsonl": ({"tenant": "acme", "id": 1.79e18}, "[acme 1.79e+18]"),
        "protobuf": ({"tenant": "acme", "id": "1790000000000000001"}, "[acme 1790000000000000001]"),
        "parquet": ({"tenant": "acme", "id": SNOWFLAKE}, "[acme 1790000000000000001]"),
    }),
    ({"id": "9007199254740993"}, ("id",), {  # a text key is never a number
        "jsonl": ({"id": "9007199254740993"}, "9007199254740993"),
        "protobuf": ({"id": "9007199254740993"}, "9007199254740993"),
        "parquet": ({"id": "9007199254740993"}, "9007199254740993"),
    }),
    ({"id": "a b", "n": 1.5}, ("id",), {
        "jsonl": ({"id": "a b", "n": 1.5}, "a b"),
        "protobuf": ({"id": "a b", "n": 1.5}, "a b"),
        "parquet": ({"id": "a b", "n": 1.5}, "a b"),
    }),
    ({"id": 100000.0, "ok": True}, ("id", "ok"), {
        "jsonl": ({"id": 100000.0, "ok": True}, "[100000 true]"),
        "protobuf": ({"id": 100000.0, "ok": True}, "[100000 true]"),
        "parquet": ({"id": 100000.0, "ok": True}, "[100000 true]"),
    }),
]


def _write(tmp: Path, format_id: str, kind: str, items: Sequence[Any], key_fields: Sequence[str]) -> Path:
    fmt = FORMATS[format_id]
    out = io.BytesIO()
    writer = fmt.snapshot_writer(out, key_fields) if kind == "snapshot" else fmt.diff_writer(out, key_fields)
    for item in items:
        writer.write(item)
    writer.close()
    path = tmp / f"{kind}-{format_id}{fmt.extension}"
    path.write_bytes(out.getvalue())
    return path


def _same(got: Any, want: Any) -> bool:
    """Equal, and of the same type (1.0 is not 1, "1" is not 1)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


@pytest.mark.parametrize("format_id", sorted(FORMATS))
@pytest.mark.parametrize(("row", "key_fields", "golden"), GOLDEN,
                         ids=[laredo_row_key(r, k) for r, k, _ in GOLDEN])
def test_golden_row_and_diff_key(tmp_path: Path, format_id: str, row: Row, key_fields: tuple[str, ...],
                                 golden: dict[str, tuple[dict[str, Any], str]]) -> None:
    want_row, want_key = golden[format_id]
    [decoded] = laredo_go.snapshot_rows(format_id, _write(tmp_path, format_id, "snapshot", [row], key_fields))
    assert _same(decoded, want_row), decoded
    assert laredo_go.row_key(decoded, key_fields) == want_key
    # Whatever key string the change arrives with, the writer derives the format's own.
    updated = {**row, "extra": "x"}
    changes = [Change(Action.UPDATE, "stale", row, updated), Change(Action.DELETE, "stale", updated, None)]
    diff = laredo_go.diff_changes(format_id, _write(tmp_path, format_id, "diff", changes, key_fields))
    assert [(action, key) for action, key, _, _ in diff] == [("UPDATE", want_key), ("DELETE", want_key)]
    table = {want_key: decoded}
    laredo_go.fold(table, diff[:1])
    assert list(table) == [want_key] and table[want_key]["extra"] == "x"  # updated in place, no ghost
    laredo_go.fold(table, diff[1:])
    assert table == {}


@pytest.mark.parametrize("format_id", sorted(FORMATS))
def test_changes_without_a_keyed_image_keep_their_key(tmp_path: Path, format_id: str) -> None:
    changes = [Change(Action.TRUNCATE), Change(Action.DELETE, "7", {"name": "no key columns"}, None)]
    diff = laredo_go.diff_changes(format_id, _write(tmp_path, format_id, "diff", changes, ("id",)))
    assert [(action, key) for action, key, _, _ in diff] == [("TRUNCATE", ""), ("DELETE", "7")]


def test_go_float_printing_matches_the_spec_vectors() -> None:
    # The model's own %v, checked against spec section 6 so it can serve as an oracle.
    assert [laredo_go.go_float(x) for x in (1e6, 1234567.0, 100000.0, 1e-5, 0.5, 42.0, -1.79e18, 1e21)] == [
        "1e+06", "1.234567e+06", "100000", "1e-05", "0.5", "42", "-1.79e+18", "1e+21"]


# --- a whole archive, rebuilt by laredo's reader at every committed position ----------------------

# Snowflakes 4096 apart: a double has a spacing of 256 there, so no two ids round to the same
# double (ids closer than that are one row to laredo's jsonl reader: its float64 number model).
IDS = [7, 1000000, BIG, *(SNOWFLAKE + 4096 * i for i in range(40))]


def _workload(seed: int, key_fields: tuple[str, ...]) -> tuple[list[Row], list[list[Change]]]:
    """Initial rows and windows of raw source changes (inserts, updates, deletes, key changes)."""
    rng = random.Random(seed)
    free = list(IDS)
    rng.shuffle(free)
    table: dict[Any, Row] = {}

    def new_row() -> Row:
        return {"id": free.pop(), "tenant": rng.choice(["acme", "globex"]), "n": rng.randrange(10**6),
                "name": f"v{rng.randrange(1000)}", "score": rng.random()}

    for _ in range(12):
        row = new_row()
        table[typed_key(row, key_fields)] = row
    initial = list(table.values())
    windows: list[list[Change]] = []
    for w in range(6):
        window: list[Change] = []
        if w == 4:  # a TRUNCATE mid-window, then rows again
            table.clear()
            window.append(Change(Action.TRUNCATE))
        for _ in range(10):
            op = rng.choice(["insert", "update", "update", "delete", "pk"] if table and free else ["insert"])
            if op == "insert" and free:
                row = new_row()
                table[typed_key(row, key_fields)] = row
                window.append(Change(Action.INSERT, laredo_row_key(row, key_fields), None, row))
                continue
            if not table:
                continue
            key = rng.choice(sorted(table, key=repr))
            old = table[key]
            if op == "delete":
                del table[key]
                window.append(Change(Action.DELETE, laredo_row_key(old, key_fields), old, None))
                continue
            new = {**old, "n": old["n"] + 1, "name": f"u{rng.randrange(1000)}"}
            if op == "pk" and free:
                new["id"] = free.pop()
                del table[key]
            table[typed_key(new, key_fields)] = new
            window.append(Change(Action.UPDATE, laredo_row_key(new, key_fields), old, new))
        windows.append(window)
    return initial, windows


@pytest.mark.parametrize("key_fields", [("id",), ("tenant", "id")], ids=["id", "tenant+id"])
def test_laredo_reader_rebuilds_the_source_from_every_format(tmp_path: Path, key_fields: tuple[str, ...]) -> None:
    formats = sorted(FORMATS)
    prefix = "items/"
    dest = LocalDestination(tmp_path)
    writer = ArtifactWriter([dest], prefix, snapshot_formats=formats, diff_formats=formats, key_fields=key_fields)

    def commit(art: Artifact) -> None:
        commit_artifact([dest], prefix, "public.items", art, cmp=comparator("lsn"))
    initial, windows = _workload(8, key_fields)
    source = {typed_key(r, key_fields): r for r in initial}

    def check(position: str) -> None:
        for format_id in formats:
            got = laredo_go.reconstruct(tmp_path, prefix, format_id, key_fields)
            assert got == laredo_go.expected_table(format_id, list(source.values()), key_fields), \
                f"{format_id} at {position}"

    commit(writer.write_snapshot(1, "0/10", initial))
    check("0/10")
    big_seen = False
    for i, window in enumerate(windows):
        from_pos, to_pos = f"0/{16 * (i + 1):X}", f"0/{16 * (i + 2):X}"
        commit(writer.write_diff(1, from_pos, to_pos, collapse(window, key_fields)))
        for change in window:
            if change.action is Action.TRUNCATE:
                source.clear()
                continue
            if change.old is not None:
                source.pop(typed_key(change.old, key_fields), None)
            if change.new is not None:
                source[typed_key(change.new, key_fields)] = change.new
        big_seen = big_seen or any(r["id"] > 2**53 for r in source.values())
        check(to_pos)
    assert big_seen and len(windows) == 6
