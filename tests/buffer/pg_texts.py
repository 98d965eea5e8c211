"""Column texts as PostgreSQL prints them, by converter spec (`pgtypes`), for the property tests
of the column-wise encoders (text_columns, text_changes): the session settings of the source
(shortest floats, ISO timestamps in UTC), and the values the kernels must hand back to the typed
path (escapes, exponents, BC dates, NaN, years past 9999, integers beyond 2^53)."""

from __future__ import annotations

import datetime as _dt
import json
from decimal import Decimal

import numpy as np
from hypothesis import strategies as st

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


def pg_float(value: float) -> str:
    """float8out's shortest text: positional for decimal exponents in [-4, 15), else d.ddde±XX."""
    exponent = Decimal(repr(value)).adjusted() if value else 0
    if -4 <= exponent < 15:
        return str(np.format_float_positional(value, unique=True, trim="-"))
    return str(np.format_float_scientific(value, unique=True, trim="-", exp_digits=2))


def pg_stamp(value: _dt.datetime, zone: bool) -> str:
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text + ("+00" if zone else "")


SPEC_TEXTS: dict[str, st.SearchStrategy[str]] = {
    "int": st.integers(-(2**63), 2**63 - 1).map(str),
    "bool": st.sampled_from(["t", "f"]),
    "text": st.one_of(TEXT, st.sampled_from(['<b>&amp;', 'q"uote', "back\\slash", "\u2028", "\x01\n\t", "é ✓ 𝄞"])),
    "float": st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(pg_float),
                       st.sampled_from(["NaN", "Infinity", "-Infinity", "1e-05", "1.5e+15", "3e+21"])),
    "timestamptz": st.one_of(st.datetimes(min_value=_dt.datetime(1, 1, 1)).map(lambda d: pg_stamp(d, True)),
                             st.sampled_from(["infinity", "-infinity", "0044-03-15 12:00:00+00 BC",
                                              "10000-01-01 00:00:00+00", "2024-05-01 12:00:00+05:30"])),
    "timestamp": st.one_of(st.datetimes(min_value=_dt.datetime(1, 1, 1)).map(lambda d: pg_stamp(d, False)),
                           st.sampled_from(["infinity", "0044-03-15 12:00:00 BC"])),
    "json": st.recursive(st.none() | st.booleans() | st.integers() | TEXT |
                         st.floats(allow_nan=False, allow_infinity=False),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                         max_leaves=8).map(json.dumps),
    "base64": st.binary(max_size=8).map(lambda b: "\\x" + b.hex()),
    "array:int": st.lists(st.integers(-5, 5).map(str) | st.just("NULL"), max_size=4).map(
        lambda items: "{" + ",".join(items) + "}"),
}
