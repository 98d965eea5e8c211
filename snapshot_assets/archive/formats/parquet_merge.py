"""Merge standalone parquet files into one by byte concatenation and a rewritten footer.

Why: a large parquet object is assembled from per-bucket pieces, some of them copied server-side
from an earlier object (a multipart upload's part copy), so the rows must never pass through this
process. Decoding and re-encoding every row group would cost the whole object's size in transfer
and CPU; concatenating the pieces' bodies costs nothing, and only the footer (a few KiB per row
group) has to be computed here.

A parquet file is `PAR1` + body + footer + footer length (uint32 LE) + `PAR1`. The body holds the
column chunks of the row groups (and possibly bloom filters and page indexes); the footer is a
Thrift compact-protocol `FileMetaData` whose offsets are absolute positions in the file. Placing a
piece's body, which starts at offset 4 in its own file, at offset `p` of the merged file therefore
moves every byte of it by `p - 4`, and the merged footer is the first piece's footer with:

- `num_rows` (field 3) the sum over the pieces;
- `row_groups` (field 4) every piece's row groups in order, each absolute offset shifted by its
  piece's move, `RowGroup.ordinal` renumbered;
- the page-index and bloom-filter references dropped: they point at structures that an assembly
  which places only the column chunks does not carry over (`merge_files` copies whole bodies, so
  there they remain as bytes nothing points at), and a reader treats their absence as "no index",
  never as damage;
- everything else (the schema, which must be byte-identical in every piece, key/value metadata
  such as Spark's row metadata, `created_by`, column orders, and any field this module has never
  heard of) passed through unchanged.

The Thrift codec is generic on purpose: it decodes into a tree of (field id, type, value) that
keeps the order and the exact values of every field, and re-encodes canonically, so a footer that
pyarrow wrote comes back byte for byte, and a field added to the format later survives the merge
instead of being silently lost. Only the handful of fields named above are interpreted.

Encrypted files are refused: their offsets live in encrypted metadata this module cannot rewrite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

MAGIC = b"PAR1"
"""The 4 bytes a plaintext parquet file starts and ends with."""

ENCRYPTED_MAGIC = b"PARE"
"""The trailing magic of a file whose footer is encrypted."""

_FOOTER_LENGTH_SIZE = 4
_TRAILER_OVERHEAD = _FOOTER_LENGTH_SIZE + len(MAGIC)
_MAX_DEPTH = 64
"""Nesting limit of the decoder: parquet's metadata nests a handful of levels; garbage may not."""


class ParquetMergeError(ValueError):
    """An input cannot be merged: malformed bytes, a footer that does not decode, differing schemas,
    encryption, or no inputs at all. The message names the input and the structure at fault."""


# --- Thrift compact protocol ---------------------------------------------------------------------

STOP = 0
BOOL_TRUE = 1
BOOL_FALSE = 2
I8 = 3
I16 = 4
I32 = 5
I64 = 6
DOUBLE = 7
BINARY = 8
LIST = 9
SET = 10
MAP = 11
STRUCT = 12

_INT_RANGES = {I8: (-(2**7), 2**7 - 1), I16: (-(2**15), 2**15 - 1), I32: (-(2**31), 2**31 - 1),
               I64: (-(2**63), 2**63 - 1)}
_TYPE_NAMES = {BOOL_TRUE: "bool", BOOL_FALSE: "bool", I8: "i8", I16: "i16", I32: "i32", I64: "i64",
               DOUBLE: "double", BINARY: "binary", LIST: "list", SET: "set", MAP: "map", STRUCT: "struct"}


@dataclass(frozen=True, slots=True)
class Struct:
    """A decoded Thrift struct: its fields in wire order (order matters for byte-exact re-encoding)."""

    fields: tuple[Field, ...]

    def get(self, field_id: int) -> Field | None:
        """The field with this id, if present (the first one, should a writer repeat it)."""
        for f in self.fields:
            if f.id == field_id:
                return f
        return None


@dataclass(frozen=True, slots=True)
class ThriftList:
    """A decoded list or set (the field or element type says which). Elements of type bool are kept
    as their raw byte, because writers disagree on its value (1/2 or 0/1) and re-encoding must not."""

    elem_type: int
    items: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class ThriftMap:
    """A decoded map; an empty map has no key/value types on the wire and keeps 0/0 here."""

    key_type: int
    value_type: int
    items: tuple[tuple[Value, Value], ...]


Value = bool | int | bytes | Struct | ThriftList | ThriftMap
"""A decoded value: bool (a struct field's bool), int (i8/i16/i32/i64, or a list's raw bool byte),
bytes (binary, or the 8 raw little-endian bytes of a double, so NaN payloads survive), or a
nested container."""


class Field(NamedTuple):
    """One struct field: its id, its compact type (BOOL_TRUE/BOOL_FALSE for bools), its value."""

    id: int
    type: int
    value: Value


class _Decoder:
    """A bounds-checked compact-protocol reader: garbage raises ParquetMergeError, never IndexError,
    a huge allocation or a RecursionError, because footers arrive from storage and can be damaged."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def fail(self, what: str) -> ParquetMergeError:
        return ParquetMergeError(f"footer does not decode as Thrift compact protocol: {what} at byte {self.pos}")

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise self.fail("unexpected end of data")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise self.fail(f"{n} bytes announced, {len(self.data) - self.pos} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def varint(self) -> int:
        result = shift = 0
        for _ in range(10):
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
        raise self.fail("varint longer than 10 bytes")

    def zigzag(self, ttype: int) -> int:
        z = self.varint()
        value = (z >> 1) ^ -(z & 1)
        lo, hi = _INT_RANGES[ttype]
        if not lo <= value <= hi:
            raise self.fail(f"{_TYPE_NAMES[ttype]} value {value} out of range")
        return value

    def size(self, n: int) -> int:
        # Every element takes at least one byte, so a size beyond the bytes left is garbage; checking
        # it up front keeps a damaged footer from announcing a billion elements.
        if n > len(self.data) - self.pos:
            raise self.fail(f"container of {n} elements in {len(self.data) - self.pos} bytes")
        return n

    def value(self, ttype: int, depth: int) -> Value:
        if ttype in (I16, I32, I64):
            return self.zigzag(ttype)
        if ttype == I8:
            b = self.byte()
            return b - 256 if b >= 128 else b
        if ttype == BINARY:
            return self.take(self.varint())
        if ttype == STRUCT:
            return self.struct(depth + 1)
        if ttype in (LIST, SET):
            return self.list(depth + 1)
        if ttype == MAP:
            return self.map(depth + 1)
        if ttype == DOUBLE:
            return self.take(8)
        if ttype in (BOOL_TRUE, BOOL_FALSE):  # a container's bool element: one raw byte
            return self.byte()
        raise self.fail(f"unknown type {ttype}")

    def check_depth(self, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise self.fail(f"nesting deeper than {_MAX_DEPTH}")

    def element_type(self, ttype: int) -> int:
        if ttype == STOP or ttype > STRUCT:
            raise self.fail(f"unknown element type {ttype}")
        return ttype

    def list(self, depth: int) -> ThriftList:
        self.check_depth(depth)
        header = self.byte()
        n = header >> 4
        if n == 15:
            n = self.varint()
        elem_type = self.element_type(header & 0x0F)
        return ThriftList(elem_type, tuple(self.value(elem_type, depth) for _ in range(self.size(n))))

    def map(self, depth: int) -> ThriftMap:
        self.check_depth(depth)
        n = self.size(self.varint())
        if n == 0:
            return ThriftMap(0, 0, ())
        types = self.byte()
        key_type, value_type = self.element_type(types >> 4), self.element_type(types & 0x0F)
        return ThriftMap(key_type, value_type,
                         tuple((self.value(key_type, depth), self.value(value_type, depth)) for _ in range(n)))

    def struct(self, depth: int) -> Struct:
        self.check_depth(depth)
        fields: list[Field] = []
        last_id = 0
        while True:
            header = self.byte()
            ftype = header & 0x0F
            if ftype == STOP:
                if header != STOP:
                    raise self.fail(f"STOP byte {header:#04x} with a field-id delta")
                return Struct(tuple(fields))
            delta = header >> 4
            field_id = last_id + delta if delta else self.zigzag(I16)
            if ftype in (BOOL_TRUE, BOOL_FALSE):
                value: Value = ftype == BOOL_TRUE
            else:
                value = self.value(ftype, depth)
            fields.append(Field(field_id, ftype, value))
            last_id = field_id


def _decode_prefix(data: bytes) -> tuple[Struct, _Decoder]:
    decoder = _Decoder(bytes(data))
    return decoder.struct(0), decoder


def _check_consumed(decoder: _Decoder) -> None:
    if decoder.pos != len(decoder.data):
        raise decoder.fail(f"{len(decoder.data) - decoder.pos} trailing bytes after the struct")


def decode_struct(data: bytes) -> Struct:
    """Decode one compact-protocol struct that spans all of `data` (trailing bytes are an error)."""
    result, decoder = _decode_prefix(data)
    _check_consumed(decoder)
    return result


def _varint(n: int, out: bytearray) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(n: int, out: bytearray) -> None:
    _varint((n << 1) if n >= 0 else ((-n) << 1) - 1, out)


def _encode_value(ttype: int, value: Value, out: bytearray) -> None:
    if ttype in (I16, I32, I64):
        assert isinstance(value, int)
        _zigzag(value, out)
    elif ttype == I8 or ttype in (BOOL_TRUE, BOOL_FALSE):  # bools here are a container's raw bytes
        assert isinstance(value, int)
        out.append(value & 0xFF)
    elif ttype == BINARY:
        assert isinstance(value, bytes)
        _varint(len(value), out)
        out += value
    elif ttype == DOUBLE:
        assert isinstance(value, bytes) and len(value) == 8
        out += value
    elif ttype == STRUCT:
        assert isinstance(value, Struct)
        _encode_struct(value, out)
    elif ttype in (LIST, SET):
        assert isinstance(value, ThriftList)
        n = len(value.items)
        if n < 15:
            out.append((n << 4) | value.elem_type)
        else:
            out.append(0xF0 | value.elem_type)
            _varint(n, out)
        for item in value.items:
            _encode_value(value.elem_type, item, out)
    elif ttype == MAP:
        assert isinstance(value, ThriftMap)
        _varint(len(value.items), out)
        if value.items:
            out.append((value.key_type << 4) | value.value_type)
        for k, v in value.items:
            _encode_value(value.key_type, k, out)
            _encode_value(value.value_type, v, out)
    else:
        raise ParquetMergeError(f"cannot encode Thrift type {ttype}")


def _encode_struct(s: Struct, out: bytearray) -> None:
    last_id = 0
    for f in s.fields:
        ftype = f.type
        if ftype in (BOOL_TRUE, BOOL_FALSE):
            ftype = BOOL_TRUE if f.value else BOOL_FALSE
        delta = f.id - last_id
        if 0 < delta <= 15:
            out.append((delta << 4) | ftype)
        else:
            out.append(ftype)
            _zigzag(f.id, out)
        if ftype not in (BOOL_TRUE, BOOL_FALSE):
            _encode_value(ftype, f.value, out)
        last_id = f.id
    out.append(STOP)


def encode_struct(s: Struct) -> bytes:
    """Encode a struct canonically (short field headers whenever the id delta is 1..15, short list
    headers below 15 elements, minimal varints), which is how Thrift's own writers encode, so that
    decode→encode of their output is the identity."""
    out = bytearray()
    _encode_struct(s, out)
    return bytes(out)


# --- the file ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitFile:
    """Where a standalone parquet file's parts are: its body is bytes [body_start, body_end), its
    footer (the FileMetaData bytes) follows the body."""

    body_start: int
    body_end: int
    footer: bytes


def split_file(data: bytes | memoryview) -> SplitFile:
    """Locate the body and the footer of one standalone parquet file, checking both magics and the
    footer length, so a damaged piece is refused before it can be placed into a merged object."""
    view = memoryview(data).cast("B")
    size = len(view)
    if size < len(MAGIC) + _TRAILER_OVERHEAD:
        raise ParquetMergeError(f"not a parquet file: {size} bytes is shorter than the "
                                f"{len(MAGIC) + _TRAILER_OVERHEAD}-byte minimum (truncated?)")
    head, tail = bytes(view[:4]), bytes(view[-4:])
    if ENCRYPTED_MAGIC in (head, tail):
        raise ParquetMergeError(f"encrypted parquet footer ({ENCRYPTED_MAGIC.decode()}) is not supported")
    if head != MAGIC:
        raise ParquetMergeError(f"not a parquet file: starts with {head!r}, not {MAGIC!r}")
    if tail != MAGIC:
        raise ParquetMergeError(f"not a parquet file or truncated: ends with {tail!r}, not {MAGIC!r}")
    footer_length = int.from_bytes(view[-_TRAILER_OVERHEAD:-len(MAGIC)], "little")
    body_end = size - _TRAILER_OVERHEAD - footer_length
    if footer_length == 0 or body_end < len(MAGIC):
        raise ParquetMergeError(f"footer length {footer_length} out of range for a {size}-byte file "
                                f"(at most {size - len(MAGIC) - _TRAILER_OVERHEAD})")
    return SplitFile(body_start=len(MAGIC), body_end=body_end,
                     footer=bytes(view[body_end:size - _TRAILER_OVERHEAD]))


def trailer(footer: bytes) -> bytes:
    """What follows the bodies of a merged file: the footer, its length and the closing magic."""
    if len(footer) >= 2**32:
        raise ParquetMergeError(f"footer of {len(footer)} bytes does not fit parquet's 32-bit length")
    return footer + len(footer).to_bytes(_FOOTER_LENGTH_SIZE, "little") + MAGIC


# --- the merge -----------------------------------------------------------------------------------

# FileMetaData
_FMD_SCHEMA, _FMD_NUM_ROWS, _FMD_ROW_GROUPS = 2, 3, 4
_FMD_ENCRYPTION = (8, 9)  # encryption_algorithm, footer_signing_key_metadata
# RowGroup
_RG_COLUMNS, _RG_FILE_OFFSET, _RG_ORDINAL = 1, 5, 7
# ColumnChunk
_CC_FILE_PATH, _CC_FILE_OFFSET, _CC_META_DATA = 1, 2, 3
_CC_DROPPED = frozenset({4, 5, 6, 7})  # offset index offset/length, column index offset/length
_CC_ENCRYPTION = (8, 9)  # crypto_metadata, encrypted_column_metadata
# ColumnMetaData
_CMD_OFFSETS = frozenset({9, 10, 11})  # data, index, dictionary page offsets
_CMD_DROPPED = frozenset({14, 15})  # bloom filter offset/length

_I16_MAX = 2**15 - 1
_I64_MAX = 2**63 - 1


def _expect(f: Field, ttype: int, where: str) -> None:
    if f.type != ttype:
        raise ParquetMergeError(f"{where}: field {f.id} has type {_TYPE_NAMES.get(f.type, f.type)}, "
                                f"expected {_TYPE_NAMES[ttype]}")


def _struct_list(f: Field, where: str) -> tuple[Struct, ...]:
    _expect(f, LIST, where)
    assert isinstance(f.value, ThriftList)
    if f.value.elem_type != STRUCT:
        elem = _TYPE_NAMES.get(f.value.elem_type, f.value.elem_type)
        raise ParquetMergeError(f"{where}: field {f.id} is a list of {elem}, expected a list of structs")
    return tuple(item for item in f.value.items if isinstance(item, Struct))


def _shifted(f: Field, shift: int, where: str) -> Field:
    _expect(f, I64, where)
    assert isinstance(f.value, int)
    if f.value == 0:  # no valid offset is 0 (the magic is there): some writers' "not set"
        return f
    moved = f.value + shift
    if not 0 < moved <= _I64_MAX:
        raise ParquetMergeError(f"{where}: offset {f.value} shifted by {shift} is no valid file offset")
    return f._replace(value=moved)


def _column_meta_data(md: Struct, shift: int, where: str) -> Struct:
    fields = []
    for f in md.fields:
        if f.id in _CMD_DROPPED:
            continue
        fields.append(_shifted(f, shift, where) if f.id in _CMD_OFFSETS else f)
    return Struct(tuple(fields))


def _column_chunk(cc: Struct, shift: int, where: str) -> Struct:
    fields = []
    for f in cc.fields:
        if f.id in _CC_ENCRYPTION:
            raise ParquetMergeError(f"{where}: encrypted column chunks are not supported")
        if f.id == _CC_FILE_PATH and f.value != b"":
            raise ParquetMergeError(f"{where}: the column chunk lives in another file ({f.value!r}); "
                                    "only standalone files can be merged")
        if f.id in _CC_DROPPED:
            continue
        if f.id == _CC_FILE_OFFSET:
            f = _shifted(f, shift, where)
        elif f.id == _CC_META_DATA:
            _expect(f, STRUCT, where)
            assert isinstance(f.value, Struct)
            f = f._replace(value=_column_meta_data(f.value, shift, f"{where}, meta_data"))
        fields.append(f)
    return Struct(tuple(fields))


def _row_group(rg: Struct, shift: int, ordinal: int, where: str) -> Struct:
    fields = []
    for f in rg.fields:
        if f.id == _RG_COLUMNS:
            chunks = _struct_list(f, where)
            f = f._replace(value=ThriftList(STRUCT, tuple(
                _column_chunk(cc, shift, f"{where}, column {j}") for j, cc in enumerate(chunks))))
        elif f.id == _RG_FILE_OFFSET:
            f = _shifted(f, shift, where)
        elif f.id == _RG_ORDINAL:
            _expect(f, I16, where)
            if ordinal > _I16_MAX:
                raise ParquetMergeError(f"{where}: more than {_I16_MAX + 1} row groups do not fit "
                                        "RowGroup.ordinal (an i16)")
            f = f._replace(value=ordinal)
        fields.append(f)
    return Struct(tuple(fields))


def _schema_difference(first: Struct, other: Struct) -> str:
    """Say where two FileMetaData schemas part, by SchemaElement name (field 4) where the names
    differ, so the error points at a column instead of at two opaque byte strings."""
    a, b = _schema_elements(first), _schema_elements(other)
    names_a, names_b = [_element_name(x) for x in a], [_element_name(y) for y in b]
    for i, (x, y) in enumerate(zip(names_a, names_b, strict=False)):
        if x != y:
            return f"schema element {i} is named {x} in input 0 and {y} in this input"
    if len(a) != len(b):
        return f"{len(a)} schema elements in input 0, {len(b)} in this input"
    for i, (element_a, element_b) in enumerate(zip(a, b, strict=True)):
        if element_a != element_b:
            return f"schema element {i} ({names_a[i]}) differs in type, repetition or annotation"
    return "the schemas are encoded differently"


def _schema_elements(md: Struct) -> tuple[Value, ...]:
    f = md.get(_FMD_SCHEMA)
    return f.value.items if f is not None and isinstance(f.value, ThriftList) else ()


def _element_name(element: Value) -> str:
    name = element.get(4) if isinstance(element, Struct) else None
    if name is None or not isinstance(name.value, bytes):
        return "<unnamed>"
    return repr(name.value.decode("utf-8", "replace"))


def merge_footers(footers: Sequence[tuple[bytes, int]]) -> bytes:
    """The FileMetaData of the file made by placing each input's body at its given offset.

    Each item is (an input's FileMetaData bytes, the offset in the merged file at which that
    input's body, originally at offset 4, now starts). Everything but the row-group offsets, the
    row count and the dropped index references comes from the first input; see the module
    docstring for why.
    """
    if not footers:
        raise ParquetMergeError("nothing to merge: no inputs")
    first: Struct | None = None
    first_schema = b""
    num_rows = 0
    row_groups: list[Struct] = []
    for i, (footer, placed) in enumerate(footers):
        where = f"input {i}"
        if placed < len(MAGIC):
            raise ParquetMergeError(f"{where}: body placed at offset {placed}, inside the leading magic")
        try:
            md, decoder = _decode_prefix(footer)
            # Before the trailing-bytes check: a plaintext footer of an encrypted file is followed
            # by its signature, and "encrypted" is the message that helps.
            for fid in _FMD_ENCRYPTION:
                if md.get(fid) is not None:
                    raise ParquetMergeError("encrypted parquet files are not supported")
            _check_consumed(decoder)
        except ParquetMergeError as e:
            raise ParquetMergeError(f"{where}: {e}") from None
        schema, rows, groups = md.get(_FMD_SCHEMA), md.get(_FMD_NUM_ROWS), md.get(_FMD_ROW_GROUPS)
        if schema is None or rows is None or groups is None:
            raise ParquetMergeError(f"{where}: FileMetaData lacks schema, num_rows or row_groups")
        _struct_list(schema, where)
        schema_bytes = encode_struct(Struct((schema,)))
        if first is None:
            first, first_schema = md, schema_bytes
        elif schema_bytes != first_schema:
            raise ParquetMergeError(f"{where}: schema differs from input 0's: {_schema_difference(first, md)}")
        _expect(rows, I64, where)
        assert isinstance(rows.value, int)
        num_rows += rows.value
        shift = placed - len(MAGIC)
        for rg in _struct_list(groups, where):
            row_groups.append(_row_group(rg, shift, len(row_groups), f"{where}, row group {len(row_groups)}"))
    assert first is not None
    if num_rows > _I64_MAX:
        raise ParquetMergeError(f"merged num_rows {num_rows} leaves the int64 range")
    merged = []
    for f in first.fields:
        if f.id == _FMD_NUM_ROWS:
            f = f._replace(value=num_rows)
        elif f.id == _FMD_ROW_GROUPS:
            f = f._replace(value=ThriftList(STRUCT, tuple(row_groups)))
        merged.append(f)
    return encode_struct(Struct(tuple(merged)))


def merge_files(files: Sequence[bytes | memoryview]) -> bytes:
    """One parquet file holding every input's rows in order: the reference layout (bodies back to
    back right after the leading magic) that a server-side assembly of the same pieces reproduces."""
    if not files:
        raise ParquetMergeError("nothing to merge: no inputs")
    parts: list[bytes | memoryview] = [MAGIC]
    footers: list[tuple[bytes, int]] = []
    offset = len(MAGIC)
    for i, data in enumerate(files):
        try:
            split = split_file(data)
        except ParquetMergeError as e:
            raise ParquetMergeError(f"input {i}: {e}") from None
        footers.append((split.footer, offset))
        body = memoryview(data).cast("B")[split.body_start:split.body_end]
        parts.append(body)
        offset += len(body)
    parts.append(trailer(merge_footers(footers)))
    return b"".join(parts)
