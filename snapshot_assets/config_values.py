"""Parsing of configuration scalars: durations, sizes, fractions, with errors that say what was wrong.

laredo's config turns an unparseable duration or size into 0, which silently disables a
trigger; here every value either parses or the load fails naming the key and the value.
"""

from __future__ import annotations

import datetime as _dt
import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

from dateutil.relativedelta import relativedelta

_DURATION_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0,
}
_HOCON_DURATION_UNITS = {
    "nanosecond": "ns", "nanoseconds": "ns", "microsecond": "us", "microseconds": "us",
    "millisecond": "ms", "milliseconds": "ms", "second": "s", "seconds": "s", "sec": "s", "secs": "s",
    "minute": "m", "minutes": "m", "min": "m", "mins": "m", "hour": "h", "hours": "h",
    "day": "d", "days": "d",
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-zµ]+)")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)")
_SIZE_UNITS = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "k": 1024, "ki": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mi": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gi": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "ti": 1024**4, "tib": 1024**4, "tb": 1000**4,
}


class ValueParseError(ValueError):
    """A scalar that does not parse; the config loader adds the file and key path."""


_T = TypeVar("_T")


def _in_range(parse: Callable[[Any], _T]) -> Callable[[Any], _T]:
    """`parse`, with a number too large for its type (a timedelta beyond 999999999 days, a float
    beyond 1.8e308, an int too large for a float) refused as a ValueParseError naming the value."""

    @functools.wraps(parse)
    def checked(value: Any) -> _T:
        try:
            return parse(value)
        except OverflowError:
            raise ValueParseError(f"{value!r} is out of range") from None

    return checked


@_in_range
def parse_duration(value: Any) -> _dt.timedelta:
    """Go durations (`30s`, `1h30m`, `250ms`), HOCON durations (`10 minutes`), plain seconds, `0`.

    pyhocon pre-parses some unquoted durations into timedelta/relativedelta; those are accepted
    when they are a fixed length (months and years are not).
    """
    if isinstance(value, _dt.timedelta):
        if value < _dt.timedelta(0):
            raise ValueParseError(f"duration {value!r} is negative")
        return value
    if isinstance(value, relativedelta):
        if value.years or value.months:
            raise ValueParseError(f"duration {value!r} uses months or years, which have no fixed length")
        return parse_duration(_dt.timedelta(days=value.days, hours=value.hours, minutes=value.minutes,
                                            seconds=value.seconds, microseconds=value.microseconds))
    if isinstance(value, bool):
        raise ValueParseError(f"expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueParseError(f"duration {value!r} is negative")
        return _dt.timedelta(seconds=value)
    if not isinstance(value, str):
        raise ValueParseError(f"expected a duration like 30s or 5m, got {value!r}")
    text = value.strip().lower()
    if text in ("0", ""):
        if text == "":
            raise ValueParseError("empty duration")
        return _dt.timedelta(0)
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if text[pos:m.start()].strip():
            break
        unit = _HOCON_DURATION_UNITS.get(m.group(2), m.group(2))
        if unit not in _DURATION_UNITS:
            raise ValueParseError(f"duration {value!r}: unknown unit {m.group(2)!r} (use ms, s, m, h, d)")
        total += float(m.group(1)) * _DURATION_UNITS[unit]
        pos = m.end()
    if pos == 0 or text[pos:].strip():
        raise ValueParseError(f"cannot parse duration {value!r} (expected e.g. 30s, 5m, 1h30m, 250ms)")
    return _dt.timedelta(seconds=total)


@_in_range
def parse_size(value: Any) -> int:
    """Byte sizes: `32MiB`, `1GB`, `512k`, plain integers. Binary units for K/M/G/T and *iB, SI for *B."""
    if isinstance(value, bool):
        raise ValueParseError(f"expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueParseError(f"size {value} is negative")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if not isinstance(value, str):
        raise ValueParseError(f"expected a size like 32MiB, got {value!r}")
    m = _SIZE.fullmatch(value.strip())
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _SIZE_UNITS:
        raise ValueParseError(f"cannot parse size {value!r} (expected e.g. 1048576, 32MiB, 1GB)")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


@_in_range
def parse_fraction(value: Any) -> float:
    """A non-negative fraction (0 disables a fraction trigger; 1.5 means 150%); `25%` is accepted too."""
    if isinstance(value, str) and value.strip().endswith("%"):
        value = _number(value.strip()[:-1]) / 100
    number = _number(value)
    if not number >= 0 or number == float("inf"):
        raise ValueParseError(f"fraction {value!r} must be a finite number >= 0")
    return number


@_in_range
def parse_count(value: Any) -> int:
    number = _number(value)
    if number < 0 or not float(number).is_integer():
        raise ValueParseError(f"expected a non-negative integer, got {value!r}")
    return int(number)


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
        return value.lower() in ("true", "yes", "on")
    raise ValueParseError(f"expected true or false, got {value!r}")


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueParseError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        raise ValueParseError(f"expected a number, got {value!r}") from None
