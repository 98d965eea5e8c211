"""Go's encoding/json, byte for byte, and the value model every artifact format shares.

laredo writes its jsonl artifacts with Go's `json.Marshal` of `map[string]any`, and consumers may
compare those bytes, so this module reproduces that output exactly rather than approximating it
with Python's `json.dumps` (which sorts and spaces differently, prints `42.0`, `1e+16` and raw
`<`, and cannot print integers above 4300 digits):

- object keys sorted by their UTF-8 bytes, no whitespace;
- strings: `"` and `\\` escaped, `\\n \\r \\t \\b \\f` as short escapes (Go >= 1.22), other control
  characters as `\\u00XX` (lowercase hex), `<` `>` `&` as `\\u003c \\u003e \\u0026`, U+2028/U+2029
  escaped, every other character raw UTF-8; a lone surrogate (text that came from invalid bytes)
  becomes the escape `\\ufffd`, which is what Go writes for each invalid UTF-8 sequence;
- int: exact decimal of any size; float: `gonum.go_json_float`; NaN and ±Inf are not encodable;
- bytes: standard base64 (Go's `[]byte`); datetime: RFC 3339 with trimmed nanoseconds, as Go's
  `time.Time` marshals (naive datetimes are UTC); date: `YYYY-MM-DD`; Decimal: its decimal text as a
  JSON number.

The same classification (`kind_of`) and scalar renderings (`time_text`, `bytes_text`, ...) are used by
the protobuf and parquet formats, so the three formats agree on what a value is and which values
are refused, and there is exactly one place that decides it.

Entry points: `encode_row` / `encode_value` / `quote` / `encode_object` for artifact lines (raising
`UnsupportedValue`, an EncodeError that rows locate by column and row key); `marshal` and
`marshal_indent` for whole documents (the manifest is Go's `MarshalIndent` of a struct: pass dicts in
field order); `loads` to read JSON back with exact integers.
"""

from __future__ import annotations

import base64
import datetime as _dt
import enum
import gc
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from snapshot_assets.archive.errors import CorruptArtifact, EncodeError
from snapshot_assets.archive.gonum import go_json_float

#: Largest magnitude up to which every integer is exactly representable as an IEEE double.
MAX_SAFE_INT = 2**53


class UnsupportedValue(EncodeError):
    """A value that has no encoding, raised where the value is met.

    Converters deep inside a row do not know which column or row they are in; the row-level code
    catches this and re-raises it with `in_row`, so the operator's message always names both.
    """

    def in_row(self, column: str, row_key: str) -> EncodeError:
        """The same problem, located: an EncodeError naming the column and the row key."""
        return EncodeError(self.args[0], column=column, row_key=row_key)


class Kind(enum.Enum):
    """What a Python value is, as far as the archive formats are concerned."""

    NULL = "null"
    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    STRING = "string"
    BYTES = "bytes"
    DATETIME = "datetime"
    DATE = "date"
    DECIMAL = "decimal"
    OBJECT = "object"
    ARRAY = "array"


# Exact-type lookup first: almost every value is one of these, and a dict hit is far cheaper than an
# isinstance chain. Subclasses (IntEnum, StrEnum, OrderedDict, ...) take the slow path below.
_KIND_BY_TYPE: dict[type, Kind] = {
    type(None): Kind.NULL,
    bool: Kind.BOOL,
    int: Kind.INT,
    float: Kind.FLOAT,
    str: Kind.STRING,
    bytes: Kind.BYTES,
    bytearray: Kind.BYTES,
    memoryview: Kind.BYTES,
    _dt.datetime: Kind.DATETIME,
    _dt.date: Kind.DATE,
    Decimal: Kind.DECIMAL,
    dict: Kind.OBJECT,
    list: Kind.ARRAY,
    tuple: Kind.ARRAY,
}

# Order matters: bool is an int, datetime is a date.
_KIND_BY_BASE: tuple[tuple[type | tuple[type, ...], Kind], ...] = (
    (bool, Kind.BOOL),
    (int, Kind.INT),
    (float, Kind.FLOAT),
    (str, Kind.STRING),
    ((bytes, bytearray, memoryview), Kind.BYTES),
    (_dt.datetime, Kind.DATETIME),
    (_dt.date, Kind.DATE),
    (Decimal, Kind.DECIMAL),
    (Mapping, Kind.OBJECT),
    ((list, tuple), Kind.ARRAY),
)


def kind_of(value: Any) -> Kind:
    """Classify `value`, refusing what no format can hold (unknown types, NaN, ±Infinity).

    Only the value itself is checked; the contents of an object or array are checked by whatever
    walks them.
    """
    kind = _KIND_BY_TYPE.get(type(value))
    if kind is None:
        kind = _kind_by_base(value)
    if kind is Kind.FLOAT and not math.isfinite(value):
        raise UnsupportedValue(f"{value!r} is not encodable: NaN and Infinity have no JSON or Struct form")
    if kind is Kind.DECIMAL and not value.is_finite():
        raise UnsupportedValue(f"Decimal {value} is not encodable: NaN and Infinity have no JSON form")
    return kind


def _kind_by_base(value: Any) -> Kind:
    for base, kind in _KIND_BY_BASE:
        if isinstance(value, base):
            return kind
    raise UnsupportedValue(
        f"unsupported value type {type(value).__module__}.{type(value).__qualname__}; expected str, int, "
        "float, bool, None, dict, list, bytes, datetime, date or Decimal"
    )


def object_items(value: Mapping[Any, Any]) -> Iterator[tuple[str, Any]]:
    """The (key, value) pairs of a nested object, refusing non-string keys (Go's map[string]any)."""
    for key, item in value.items():
        if not isinstance(key, str):
            raise UnsupportedValue(f"object key {key!r} is a {type(key).__name__}; keys must be strings")
        yield key, item


# --- scalar renderings shared by every format -------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD, so it can be written as UTF-8.

    Lone surrogates are how Python carries undecodable bytes (surrogateescape); Go replaces each
    invalid UTF-8 sequence with U+FFFD, and protobuf and Arrow refuse them outright.
    """
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub("\ufffd", text)


def time_text(value: _dt.datetime) -> str:
    """RFC 3339 exactly as Go's `time.Time.MarshalJSON` writes it (without the quotes).

    Fractional seconds appear only when non-zero, with trailing zeros trimmed; a zero offset (or a
    naive datetime, taken as UTC) is `Z`; other offsets are `±hh:mm` with seconds truncated, as Go does.
    """
    text = (f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
            f"T{value.hour:02d}:{value.minute:02d}:{value.second:02d}")
    if value.microsecond:
        text += "." + f"{value.microsecond:06d}".rstrip("0")
    offset = value.utcoffset()
    seconds = 0 if offset is None else int(offset.total_seconds())
    if seconds == 0:
        return text + "Z"
    minutes = -(-seconds // 60) if seconds < 0 else seconds // 60  # Go's int division truncates
    sign = "-" if minutes < 0 else "+"
    minutes = abs(minutes)
    return f"{text}{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def date_text(value: _dt.date) -> str:
    """`YYYY-MM-DD`: a date's RFC 3339 full-date."""
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"


def bytes_text(value: bytes | bytearray | memoryview) -> str:
    """Standard base64 with padding, as Go's encoding/json writes a `[]byte`."""
    return base64.b64encode(value).decode("ascii")


# int -> str is limited to 4300 digits by default (sys.set_int_max_str_digits); Decimal is not.
_STR_SAFE_BITS = 14_000


def int_text(value: int) -> str:
    """Exact decimal text of an integer of any size."""
    value = int(value)  # IntEnum and friends print their names otherwise
    if value.bit_length() <= _STR_SAFE_BITS:
        return str(value)
    return str(Decimal(value))


def decimal_text(value: Decimal) -> str:
    """A finite Decimal's text, which is always a valid JSON number (`1.10`, `1E+3`, `-0`)."""
    return str(value)


# --- the encoder ------------------------------------------------------------------------------

_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_ESCAPES: dict[str, str] = {
    **{chr(c): f"\\u{c:04x}" for c in range(0x20)},
    **{c: f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"},
    **_SHORT_ESCAPES,
}
_NEEDS_ESCAPE = re.compile('[\x00-\x1f"\\\\<>&\u2028\u2029\ud800-\udfff]')


def _escape(match: re.Match[str]) -> str:
    # Anything not in the table is a lone surrogate, which Go writes as the escape \ufffd.
    return _ESCAPES.get(match.group(), "\\ufffd")


def quote(text: str) -> str:
    """A JSON string literal exactly as Go's encoding/json writes `text` (HTML-safe escaping on)."""
    if _NEEDS_ESCAPE.search(text) is None:
        return '"' + text + '"'
    return '"' + _NEEDS_ESCAPE.sub(_escape, text) + '"'


def _join_object(members: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(quote(key) + ":" + text for key, text in members) + "}"


def encode_object(members: Iterable[tuple[str, str]]) -> str:
    """An object from (key, already-encoded value) pairs, keys in Go's map order (UTF-8 byte order).

    Code point order is UTF-8 byte order, so sorting the Python strings is enough.
    """
    return _join_object(sorted(members))


def _encode_decimal(value: Decimal) -> str:
    # A JSON reader (Go's into float64, Python's float) would turn an out-of-range number into an
    # error or an infinity; refuse it here instead of writing an artifact nobody can read.
    if math.isinf(float(value)):
        raise UnsupportedValue(f"Decimal {value} is beyond the float64 range JSON readers decode into")
    return decimal_text(value)


_SCALAR_ENCODERS: dict[Kind, Callable[[Any], str]] = {
    Kind.NULL: lambda _value: "null",
    Kind.BOOL: lambda value: "true" if value else "false",
    Kind.INT: int_text,
    Kind.FLOAT: lambda value: go_json_float(float(value)),
    Kind.STRING: lambda value: quote(str(value)),
    Kind.BYTES: lambda value: '"' + bytes_text(value) + '"',
    Kind.DATETIME: lambda value: '"' + time_text(value) + '"',
    Kind.DATE: lambda value: '"' + date_text(value) + '"',
    Kind.DECIMAL: _encode_decimal,
}


def _make_encoder(sort_keys: bool) -> Callable[[Any], str]:
    """An encoder whose objects are Go maps (keys sorted) or Go structs (keys in insertion order)."""
    order: Callable[[Iterable[tuple[str, str]]], Iterable[tuple[str, str]]] = sorted if sort_keys else iter
    encoders: dict[Kind, Callable[[Any], str]] = dict(_SCALAR_ENCODERS)

    def encode(value: Any) -> str:
        return encoders[kind_of(value)](value)

    def encode_obj(value: Mapping[Any, Any]) -> str:
        return _join_object(order([(key, encode(item)) for key, item in object_items(value)]))

    def encode_array(value: list[Any] | tuple[Any, ...]) -> str:
        return "[" + ",".join(encode(item) for item in value) + "]"

    encoders.update({Kind.OBJECT: encode_obj, Kind.ARRAY: encode_array})
    return encode


_encode_sorted = _make_encoder(sort_keys=True)
_encode_ordered = _make_encoder(sort_keys=False)


def encode_value(value: Any) -> str:
    """Go's `json.Marshal` of one value (dicts as maps); raises UnsupportedValue, not yet located.

    Plain values go through the standard library's C encoder (see `_stdlib_text`), the rest
    through the exact encoder; both give the same bytes.
    """
    text = _stdlib_text(value)
    return _encode_sorted(value) if text is None else _html_escaped(text)


_stdlib_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")).encode


# Where Python's float repr and Go's encoding differ: integral floats (`1.0` vs `1`) and exponent
# forms (Python switches to them below 1e-4 and from 1e16, Go below 1e-6 and from 1e21, with
# different exponent padding). String literals are blanked first so their digits cannot match.
#: The grammar of a JSON string token and of a JSON number token (RFC 8259), as regular expressions
#: that Python's `re` and RE2 (Arrow's kernels) both read.
STRING_TOKEN = r'"(?:[^"\\]|\\.)*"'
NUMBER_TOKEN = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_STRING_LITERALS = re.compile(STRING_TOKEN)
_FLOAT_FORMS_GO_WRITES_OTHERWISE = re.compile(r"[0-9]\.0(?![0-9])|[0-9][eE][-+]?[0-9]")


def _string_keys_only(value: Any) -> bool:
    pending = [value]
    while pending:
        item = pending.pop()
        if type(item) is dict:
            for k, v in item.items():
                if type(k) is not str:
                    return False
                if type(v) is dict or type(v) is list:
                    pending.append(v)
        elif type(item) is list:
            pending.extend(v for v in item if type(v) is dict or type(v) is list)
    return True


def _stdlib_text(value: Any) -> str | None:
    """The C encoder's text for `value` when it is byte-identical to Go's, else None.

    Refused here (the exact encoder takes over): types JSON has no literal for (datetime, bytes,
    Decimal), NaN/Infinity, integers too long for Python's int-to-str limit, lone surrogates, and any
    float the two languages print differently. Checking the finished text with two C-level regex
    passes costs less than walking the value in Python, which matters: every buffered row comes here.
    """
    try:
        text = _stdlib_dumps(value)
    except (TypeError, ValueError):
        return None
    # The C encoder turns int/float/bool/None keys into strings; rows are map[string]any, so such a
    # key must reach the exact encoder's refusal. Only objects can hold keys: look only when there are.
    if "{" in text and not _string_keys_only(value):
        return None
    if not text.isascii() and _SURROGATE.search(text):
        return None
    if "." in text or "e" in text or "E" in text:
        bare = _STRING_LITERALS.sub('""', text) if '"' in text else text
        if _FLOAT_FORMS_GO_WRITES_OTHERWISE.search(bare):
            return None
    return text


def _html_escaped(text: str) -> str:
    """Go's HTML-safe escapes, applied only where needed (`str.translate` is slow on non-ASCII text)."""
    if "<" in text:
        text = text.replace("<", "\\u003c")
    if ">" in text:
        text = text.replace(">", "\\u003e")
    if "&" in text:
        text = text.replace("&", "\\u0026")
    if "\u2028" in text or "\u2029" in text:
        text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return text


_SURROGATE = re.compile("[\ud800-\udfff]")


class _NotGoFloat(ValueError):
    """A number whose Go spelling the C encoder cannot print: the documents go one by one."""


def _go_number(text: str) -> float | int:
    """A JSON fraction as `json.loads` reads it (a float), given as whatever the C encoder prints
    exactly as Go does: the float itself when its repr is Go's text, else Go's integer text as an int."""
    value = float(text)
    go = go_json_float(value)  # UnsupportedValue for ±Infinity (an overflowing exponent)
    if repr(value) == go:
        return value
    if go.lstrip("-").isdigit() and str(int(go)) == go:
        return int(go)
    raise _NotGoFloat(go)


_DOCUMENT_SEP = "\x00"  # no JSON document from PostgreSQL holds it (checked: the input has no `\u0000`)
_ENCODED_SEP = ',"\\u0000",'


def encode_documents(texts: Sequence[str]) -> list[str] | None:
    """`encode_value(json.loads(text))` for each JSON document in `texts`, with one decode and one
    encode of them all (C code, no Python per document), or None when a document needs the exact
    encoder one at a time (a lone surrogate, an integer past Python's digit limit, NaN, a float Go
    spells in a form the C encoder does not, a NUL character, nesting too deep for the C parser).

    Why: PostgreSQL json/jsonb columns have no Arrow kernel, and a copy has one document per row.
    The documents are decoded as one JSON array; fractions are read by `_go_number`, so the C
    encoder prints every number as Go does; the array is encoded with a separator string between
    the documents, which no encoded document can contain (it is a NUL, and a structural `,"`),
    split there (the last one is followed by `,"\\u0000"]`, as long), and given Go's HTML escapes."""
    if not texts:
        return []
    joined = "[" + ",".join(texts) + "]"
    if "\\u0000" in joined:
        return None
    # The decoded documents are all alive at once, acyclic and freed together: without this, the
    # allocations set off collections of the process's whole heap (slower than one document at a time).
    collecting = gc.isenabled()
    gc.disable()
    try:
        values = json.loads(joined, parse_float=_go_number)
        if len(values) != len(texts):
            return None
        spaced: list[Any] = [_DOCUMENT_SEP] * (2 * len(values))
        spaced[0::2] = values
        text = _stdlib_dumps(spaced)
    except (ValueError, RecursionError, UnsupportedValue):
        return None
    finally:
        if collecting:
            gc.enable()
    if not text.isascii() and _SURROGATE.search(text):
        return None
    documents = _html_escaped(text[1:-len(_ENCODED_SEP)]).split(_ENCODED_SEP)
    return documents if len(documents) == len(texts) else None


def encode_row(row: Mapping[str, Any], row_key: Callable[[], str]) -> str:
    """Go's `json.Marshal` of a row (`map[string]any`).

    `row_key` is only called when a value cannot be encoded, to name the row in the EncodeError.
    Rows of plain values go through the standard library's C encoder (3× faster), whose output is
    then byte-identical to Go's once `<`, `>`, `&`, U+2028 and U+2029 are escaped.
    """
    if type(row) is dict:  # the common case, without the per-column loop below
        text = _stdlib_text(row)
        if text is not None:
            return _html_escaped(text)
    members: list[tuple[str, str]] = []
    column = ""
    try:
        for column, value in object_items(row):
            members.append((column, encode_value(value)))
    except UnsupportedValue as exc:
        raise exc.in_row(str(column), row_key()) from None
    return encode_object(members)


def marshal(value: Any, *, sort_keys: bool = True) -> bytes:
    """Go's `json.Marshal(value)` as UTF-8 bytes.

    With `sort_keys` (the default) every dict is a Go map: keys sorted. Without it every dict is a Go
    struct whose fields were declared in the dict's insertion order.
    """
    return (encode_value if sort_keys else _encode_ordered)(value).encode("utf-8")


def marshal_indent(value: Any, prefix: str = "", indent: str = "  ", *, sort_keys: bool = False) -> bytes:
    """Go's `json.MarshalIndent(value, prefix, indent)` as UTF-8 bytes (no trailing newline).

    Dicts keep their insertion order by default, because what Go indents is typically a struct (the
    manifest); pass `sort_keys=True` for map semantics.
    """
    compact = (_encode_sorted if sort_keys else _encode_ordered)(value)
    return _indent(compact, prefix, indent).encode("utf-8")


def _indent(compact: str, prefix: str, indent: str) -> str:
    """Go's `json.Indent` over compact JSON: one element per line, `": "` after keys, empty
    objects and arrays kept as `{}` and `[]`. Only structural characters outside strings matter."""
    out: list[str] = []
    depth = 0
    in_string = escaped = False
    pending_open = False  # just wrote `{` or `[`: newline only if the container is not empty
    for char in compact:
        if in_string:
            out.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if pending_open and char not in "]}":
            out.append("\n" + prefix + indent * depth)
        pending_open = False
        if char in "{[":
            depth += 1
            pending_open = True
            out.append(char)
        elif char in "]}":
            depth -= 1
            if out[-1] not in ("{", "["):
                out.append("\n" + prefix + indent * depth)
            out.append(char)
        elif char == ",":
            out.append(",\n" + prefix + indent * depth)
        elif char == ":":
            out.append(": ")
        else:
            in_string = char == '"'
            out.append(char)
    return "".join(out)


def dumps(value: Any) -> str:
    """Go's `json.Marshal` of any supported value, as text (dicts as maps)."""
    return encode_value(value)


# --- the decoder ------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise CorruptArtifact(f"{name} is not JSON (Go's encoding/json never writes it)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise CorruptArtifact(f"number {text} is beyond the float64 range")
    return value


#: The longest integer literal a reader accepts: PostgreSQL numeric's 131072 digits before the
#: point, the widest integer any source produces. Text to int costs more than linear time (CPython
#: is quadratic past its 4300-digit limit), so a damaged artifact's megabytes of digits must be
#: refused, not converted.
MAX_INT_DIGITS = 131072
_INT_CHUNK_DIGITS = 3000  # below CPython's int/str digit limit


def _exact_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits <= _INT_CHUNK_DIGITS:
        return int(text)
    if digits > MAX_INT_DIGITS:
        raise CorruptArtifact(f"an integer of {digits} digits exceeds the {MAX_INT_DIGITS}-digit limit")
    if text.startswith("-"):
        return -_digits_value(text[1:], {})
    return _digits_value(text, {})


def _digits_value(digits: str, powers: dict[int, int]) -> int:
    """The value of a long digit string by halves (Karatsuba multiplication makes it subquadratic,
    where `int()` of the whole string is quadratic); `powers` memoizes the powers of ten."""
    if len(digits) <= _INT_CHUNK_DIGITS:
        return int(digits)
    half = len(digits) // 2
    low = len(digits) - half
    if low not in powers:
        powers[low] = 10**low
    return _digits_value(digits[:half], powers) * powers[low] + _digits_value(digits[half:], powers)


def too_deep() -> str:
    """Why a JSON document nested too deeply is refused, with the bound.

    CPython's decoder recurses once per array/object level and gives up at the interpreter's
    recursion limit (a RecursionError, not a JSONDecodeError), so that limit is the depth bound of
    every JSON input this project reads: artifacts, manifests, Connect end-of-stream frames.
    """
    return f"JSON nested deeper than {sys.getrecursionlimit()} levels"


#: `json.loads` with these hooks builds a decoder per call; one decoder, made once, parses the same.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def loads(data: bytes | bytearray | str) -> Any:
    """Parse JSON the way this project reads artifacts: integers stay exact Python ints (any size),
    NaN/Infinity literals and numbers beyond float64 are refused, input must be UTF-8.

    Every failure is a CorruptArtifact (callers add where in the artifact it happened).
    """
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptArtifact(f"invalid UTF-8: {exc}") from None
    try:
        if text.startswith("\ufeff"):  # what json.loads refuses before decoding
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise CorruptArtifact(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise CorruptArtifact(too_deep()) from None
    except ValueError:
        # Only the int digit limit (an integer of more than sys.get_int_max_str_digits() digits)
        # gets here; parse again with an exact, unlimited integer parser.
        if sys.get_int_max_str_digits() == 0:
            raise
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float,
                          parse_int=_exact_int)
    except json.JSONDecodeError as exc:  # pragma: no cover - the first parse would have failed too
        raise CorruptArtifact(f"invalid JSON: {exc}") from None
