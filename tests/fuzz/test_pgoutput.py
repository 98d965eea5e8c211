"""Fuzz the pgoutput decoder: the payload of every XLogData frame a PostgreSQL server sends.

Valid messages of every protocol-1 type (Begin, Commit, Origin, Relation, Type, Insert, Update,
Delete, Truncate, logical Message) are built per the manual's "Logical Replication Message
Formats", then mutated: lengths set to huge or negative values, strings made invalid UTF-8 or
unterminated, truncation anywhere. `decode` returns a message or raises PgOutputError.
"""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from resources.subscribers.pgoutput import PgOutputError, decode
from tests.fuzz.support import fuzz_settings, guarded, inputs

names = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=8)
int16, int32 = struct.Struct("!h"), struct.Struct("!i")
oid, lsn, timestamp = struct.Struct("!I"), struct.Struct("!Q"), struct.Struct("!q")


def cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


@st.composite
def tuple_data(draw: st.DrawFn) -> bytes:
    columns = draw(st.lists(st.one_of(st.none(), st.just("u"), st.text(max_size=8)), max_size=4))
    out = bytearray(int16.pack(len(columns)))
    for value in columns:
        if value is None:
            out += b"n"
        elif value == "u":
            out += b"u"
        else:
            data = value.encode("utf-8", "surrogatepass")
            out += b"t" + int32.pack(len(data)) + data
    return bytes(out)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    u32, u64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
    micros = st.integers(-(2**40), 2**50)
    kind = draw(st.sampled_from("BCORYIUDTM"))
    if kind == "B":
        return b"B" + lsn.pack(draw(u64)) + timestamp.pack(draw(micros)) + int32.pack(draw(st.integers(0, 2**31 - 1)))
    if kind == "C":
        return b"C\x00" + lsn.pack(draw(u64)) + lsn.pack(draw(u64)) + timestamp.pack(draw(micros))
    if kind == "O":
        return b"O" + lsn.pack(draw(u64)) + cstring(draw(names))
    if kind == "R":
        columns = draw(st.lists(st.tuples(st.integers(0, 1), names, u32, st.integers(-1, 100)), max_size=4))
        body = b"".join(bytes([flags]) + cstring(name) + oid.pack(type_oid) + int32.pack(modifier)
                        for flags, name, type_oid, modifier in columns)
        return (b"R" + oid.pack(draw(u32)) + cstring(draw(names)) + cstring(draw(names))
                + draw(st.sampled_from([b"d", b"n", b"f", b"i"])) + int16.pack(len(columns)) + body)
    if kind == "Y":
        return b"Y" + oid.pack(draw(u32)) + cstring(draw(names)) + cstring(draw(names))
    if kind == "I":
        return b"I" + oid.pack(draw(u32)) + b"N" + draw(tuple_data())
    if kind == "U":
        old = draw(st.sampled_from([b"", b"K", b"O"]))
        return b"U" + oid.pack(draw(u32)) + (old + draw(tuple_data()) if old else b"") + b"N" + draw(tuple_data())
    if kind == "D":
        return b"D" + oid.pack(draw(u32)) + draw(st.sampled_from([b"K", b"O"])) + draw(tuple_data())
    if kind == "T":
        oids = draw(st.lists(u32, max_size=3))
        return b"T" + int32.pack(len(oids)) + bytes([draw(st.integers(0, 3))]) + b"".join(oid.pack(o) for o in oids)
    content = draw(st.binary(max_size=8))
    return b"M\x01" + lsn.pack(draw(u64)) + cstring(draw(names)) + int32.pack(len(content)) + content


@fuzz_settings(600)
@given(inputs(messages()))
def test_messages_decode_or_fail_cleanly(payload: bytes) -> None:
    guarded(lambda: decode(payload), (PgOutputError,))


def _fails(payload: bytes) -> str:
    error = guarded(lambda: decode(payload), (PgOutputError,))
    assert error is not None, f"{payload!r} decoded"
    return str(error)


def test_a_huge_column_length_is_refused() -> None:
    message = _fails(b"I" + oid.pack(1) + b"N" + int16.pack(1) + b"t" + int32.pack(2**31 - 1) + b"abc")
    assert "2147483647" in message, message


def test_negative_lengths_and_counts_are_refused() -> None:
    assert "-5" in _fails(b"I" + oid.pack(1) + b"N" + int16.pack(1) + b"t" + int32.pack(-5) + b"abcdef")
    assert "-1" in _fails(b"M\x01" + lsn.pack(1) + b"p\x00" + int32.pack(-1) + b"abc")
    assert "-2" in _fails(b"T" + int32.pack(-2) + b"\x00")
    assert "-3" in _fails(b"R" + oid.pack(1) + b"s\x00t\x00d" + int16.pack(-3))


def test_invalid_utf8_is_refused_naming_the_field() -> None:
    assert "UTF-8" in _fails(b"Y" + oid.pack(1) + b"\xc3\x28\x00t\x00")
    assert "UTF-8" in _fails(b"I" + oid.pack(1) + b"N" + int16.pack(1) + b"t" + int32.pack(2) + b"\xc3\x28")


def test_an_out_of_range_timestamp_is_refused() -> None:
    assert "timestamp" in _fails(b"B" + lsn.pack(1) + timestamp.pack(2**62) + int32.pack(7))
