"""Property tests: arbitrary JSON-ish rows round-trip through every format, equal to what went in
modulo each format's documented type mapping, compared strictly (types included, floats by repr).

The mappings under test (module docstrings of gojson, jsonl, protobuf, parquet):
- jsonl: JSON's — an integral float below 1e21 comes back as an int, bytes/datetime/date as their
  base64/RFC 3339/ISO strings, a Decimal as the number its text parses to, a tuple as a list;
  integers of any size stay exact;
- protobuf: Struct's — numbers are doubles, so integers beyond ±2^53 and Decimals travel as exact
  decimal strings, an integral double within ±2^53 comes back as an int;
- parquet: exact for a column of one kind (naive datetimes come back as aware UTC); a column that
  mixes kinds or holds dicts/lists/ints beyond int64 is stored as Go-JSON text and follows jsonl.
Lone surrogates become U+FFFD everywhere (Go replaces invalid UTF-8).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.gonum import go_json_float
from snapshot_assets.archive.keys import written_key

# FORMATS_PROPERTY_EXAMPLES=5000 for a deeper search than the default run affords.
SETTINGS = settings(max_examples=int(os.environ.get("FORMATS_PROPERTY_EXAMPLES", "150")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# --- strategies ---------------------------------------------------------------------------------

texts = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=st.sampled_from('<>&"\\\n\x00\x1f\u2028\u2029\x7fé😀\ud800\udcff'), max_size=6),
)
ints = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**53, 2**53 + 1, -(2**53) - 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**40]),
)
floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 42.0, 1e21, 1e-7, 1e-6, 2.0**53, 2.0**53 + 2, 1e300, 5e-324]),
)
offsets = st.builds(dt.timezone, st.timedeltas(min_value=dt.timedelta(hours=-23, minutes=-59),
                                               max_value=dt.timedelta(hours=23, minutes=59)))
datetimes = st.datetimes(min_value=dt.datetime(2, 1, 1), max_value=dt.datetime(9998, 12, 31),
                         timezones=st.one_of(st.none(), st.just(dt.UTC), offsets))
decimals = st.decimals(allow_nan=False, allow_infinity=False, min_value=-(10**20), max_value=10**20)
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts, st.binary(max_size=8),
                    datetimes, st.dates(), decimals)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner),
                            st.dictionaries(texts, inner, max_size=3)),
    max_leaves=6,
)
# A few shared column names so columns repeat across rows (parquet types them), plus any text.
column_names = st.one_of(st.sampled_from(["id", "a", "b", "<é>", ""]), st.text(max_size=5))
rows = st.dictionaries(column_names, values, max_size=5)
images = st.one_of(st.none(), rows)
changes = st.builds(Change, st.sampled_from(list(Action)), texts, images, images)

# --- expected values: the documented mappings ---------------------------------------------------


def jsonl_view(value: Any) -> Any:
    """What a value reads back as after Go-JSON encoding."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        # Go prints an integral double below 1e21 without a fraction, with its shortest digits:
        # 2.0**53 + 2 reads back as the int 9007199254740994, 4.059822926890535e16 as
        # 40598229268905350 (the decimal Go wrote; as a float it is the same double).
        return int(go_json_float(value)) if value.is_integer() and abs(value) < 1e21 else value
    if isinstance(value, str):
        return gojson.valid_text(value)
    if isinstance(value, bytes):
        return gojson.bytes_text(value)
    if isinstance(value, dt.datetime):
        return gojson.time_text(value)
    if isinstance(value, dt.date):
        return gojson.date_text(value)
    if isinstance(value, Decimal):
        text = str(value)
        return float(text) if any(c in text for c in ".eE") else int(text)
    if isinstance(value, dict):
        return {gojson.valid_text(k): jsonl_view(v) for k, v in value.items()}
    return [jsonl_view(v) for v in value]


def protobuf_view(value: Any) -> Any:
    """What a value reads back as after a trip through google.protobuf.Struct."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if abs(value) <= 2**53 else str(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) <= 2**53 else value
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {gojson.valid_text(k): protobuf_view(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [protobuf_view(v) for v in value]
    return jsonl_view(value)  # str, bytes, datetime, date: the same strings as in JSON


def parquet_kind(value: Any) -> str:
    """The storage a single value asks for; 'json' for what only Go-JSON text can hold."""
    if value is None:
        return "null"
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return "json"
    if isinstance(value, (dict, list, tuple)):
        return "json"
    return type(value).__name__


def parquet_views(images: Sequence[Row]) -> Callable[[str, Any], Any]:
    """view(column, value) for images written together (a column's storage depends on all of them)."""
    kinds: dict[str, set[str]] = {}
    for image in images:
        for column, value in image.items():
            kinds.setdefault(column, set()).add(parquet_kind(value))

    def view(column: str, value: Any) -> Any:
        stored = kinds[column] - {"null"}
        if len(stored) > 1 or stored == {"json"}:
            return None if value is None else jsonl_view(value)
        if isinstance(value, dt.datetime):
            return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
        if isinstance(value, str):
            return gojson.valid_text(value)
        return value

    return view


def expected_rows(format_id: str, images: Sequence[Row]) -> Callable[[Row], Row]:
    if format_id == "jsonl":
        return lambda row: jsonl_view(row)  # type: ignore[no-any-return]
    if format_id == "protobuf":
        return lambda row: protobuf_view(row)  # type: ignore[no-any-return]
    view = parquet_views(images)
    return lambda row: {gojson.valid_text(k): view(k, v) for k, v in row.items()}


def assert_same(got: Any, want: Any, path: str = "$") -> None:
    """Equality that also insists on types (1 is not 1.0, "1" is not 1) and float bit patterns."""
    assert type(got) is type(want), f"{path}: {got!r} ({type(got).__name__}) != {want!r} ({type(want).__name__})"
    if isinstance(want, dict):
        assert got.keys() == want.keys(), f"{path}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{path}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert repr(got) == repr(want), f"{path}: {got!r} != {want!r}"
    elif isinstance(want, Decimal):
        assert str(got) == str(want), f"{path}: {got!r} != {want!r}"
    elif isinstance(want, dt.datetime):
        assert got == want and got.utcoffset() == want.utcoffset(), f"{path}: {got!r} != {want!r}"
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def jsonl_encodable(value: Any) -> bool:
    """Decimals beyond the float64 range have no JSON form a reader accepts (the writer refuses)."""
    try:
        gojson.dumps(value)
    except gojson.UnsupportedValue:
        return False
    return True


# --- round trips --------------------------------------------------------------------------------


def round_trip_snapshot(format_id: str, written: list[Row]) -> list[Row]:
    fmt = FORMATS[format_id]
    out = io.BytesIO()
    writer = fmt.snapshot_writer(out)
    for row in written:
        writer.write(row)
    writer.close()
    out.seek(0)
    return list(fmt.read_snapshot(out))


def round_trip_diff(format_id: str, written: list[Change]) -> list[Change]:
    fmt = FORMATS[format_id]
    out = io.BytesIO()
    writer = fmt.diff_writer(out)
    for change in written:
        writer.write(change)
    writer.close()
    out.seek(0)
    return list(fmt.read_diff(out))


@SETTINGS
@given(st.lists(rows, max_size=6), st.sampled_from(sorted(FORMATS)))
def test_snapshot_rows_round_trip(written: list[Row], format_id: str) -> None:
    if format_id == "jsonl" and not jsonl_encodable(written):
        return
    got = round_trip_snapshot(format_id, written)
    expect = expected_rows(format_id, written)
    assert_same(got, [expect(row) for row in written])


@SETTINGS
@given(st.lists(changes, max_size=5), st.sampled_from(sorted(FORMATS)))
def test_diff_changes_round_trip(written: list[Change], format_id: str) -> None:
    all_images = [image for c in written for image in (c.old, c.new) if image]
    if format_id == "jsonl" and not jsonl_encodable(all_images):
        return
    got = round_trip_diff(format_id, written)
    expect = expected_rows(format_id, all_images)
    # The key is derived from the image as this format's reader holds it (image-less: as given).
    key_value = FORMATS[format_id].key_value
    assert [(c.action, c.key) for c in got] == [
        (c.action, gojson.valid_text(written_key(c, ("id",), key_value))) for c in written]
    for g, w in zip(got, written, strict=True):
        for name in ("old", "new"):
            image = getattr(w, name)
            assert_same(getattr(g, name), expect(image) if image else None, f"{w.key}.{name}")


@SETTINGS
@given(values)
def test_go_json_parses_back_with_python_json(value: Any) -> None:
    if not jsonl_encodable(value):
        return
    text = gojson.dumps(value)
    assert_same(json.loads(text), jsonl_view(value))
    assert text.isascii() or not any(c in text for c in "<>&\u2028\u2029")  # always escaped


@SETTINGS
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text()),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(), inner,
                                                                                          max_size=3)),
                    max_leaves=8))
def test_go_json_equals_python_json_with_go_escaping(value: Any) -> None:
    python = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        python = python.replace(raw, escaped)
    assert gojson.dumps(value) == python


big_ints = st.one_of(st.integers(min_value=2**53 + 1), st.integers(max_value=-(2**53) - 1),
                     st.integers(min_value=10**30, max_value=10**60))


@SETTINGS
@given(st.lists(big_ints, min_size=1, max_size=5), st.sampled_from(["jsonl", "parquet"]))
def test_integers_beyond_2_53_stay_exact(numbers: list[int], format_id: str) -> None:
    written = [{"id": i, "n": n, "nested": {"n": [n]}} for i, n in enumerate(numbers)]
    got = round_trip_snapshot(format_id, written)
    assert_same(got, written)


_plain = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@SETTINGS
@given(st.dictionaries(st.text(max_size=6), _plain, max_size=6))
def test_stdlib_fast_path_is_byte_identical_to_the_exact_encoder(row: dict[str, Any]) -> None:
    """encode_row hands plain rows to the C encoder; its output must equal the exact Go encoder's."""
    exact = gojson._encode_sorted(row)
    assert gojson.encode_row(row, lambda: "") == exact
    assert gojson.encode_value(row) == exact
    assert gojson.encode_value(list(row.values())) == gojson._encode_sorted(list(row.values()))
