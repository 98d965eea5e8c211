"""What every fuzz module shares: byte mutations of valid encodings and a guarded parse.

The contract under test is the same for every parser of outside bytes: any input ends in success
or in the project's own error type with a message, never a hang, a raw exception from deep inside
(IndexError, struct.error, UnicodeDecodeError, RecursionError, protobuf's DecodeError...) or an
allocation that a length prefix talked it into.

Mutations start from VALID encodings, because random bytes rarely get past a parser's first check:
bit flips, truncation, insertion of random or "interesting" bytes (huge varints, all-ones 32-bit
lengths, lone continuation bytes), deletion, duplication of a slice (a splice of the input into
itself) and a splice of two valid encodings. Raw bytes are fuzzed as well, with less weight.

`guarded` runs the parse in a worker thread with a deadline (a hang fails the test, the thread is
left behind as a daemon) and tracemalloc's peak as the memory bound. Hypothesis settings: no
per-example deadline (the guard owns time), `max_examples` kept small enough that the whole
directory runs in about a minute; FUZZ_EXAMPLES scales every module's count for a deeper run.
"""

from __future__ import annotations

import os
import threading
import tracemalloc
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: A parse that takes longer than this is a hang (the inputs are a few KiB).
PARSE_SECONDS = 10.0
#: Python memory one parse may allocate at its peak: far below what a trusted absurd length would take.
PEAK_BYTES = 64 * 1024 * 1024

_SCALE = float(os.environ.get("FUZZ_EXAMPLES", "1"))


def fuzz_settings(examples: int) -> settings:
    """Settings for one property: `examples` (scaled by FUZZ_EXAMPLES), no per-example deadline."""
    return settings(max_examples=max(1, int(examples * _SCALE)), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# --- mutations -----------------------------------------------------------------------------------

#: Byte strings that break length-prefixed and text parsers most often.
INTERESTING = (
    b"\x00", b"\xff", b"\x80", b"\x7f", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00",
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # an over-long varint
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # varint of 2^56
    b"\x80\x80\x80\x80\x80\x20",  # varint of 2^40
    b"\xc3\x28", b"\xed\xa0\x80",  # invalid UTF-8, an encoded surrogate
    b"\n", b"\r\n", b"{", b"[" * 64, b'"', b"\\", b"\x00\x00\x00\x00",
)


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[bytes], *, max_ops: int = 4) -> bytes:
    """A valid encoding from `valid` with 1..`max_ops` mutations applied."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(("flip", "truncate", "insert", "interesting", "delete", "duplicate",
                                   "splice", "overwrite")))
        at = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            i = min(at, len(data) - 1)
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "interesting":
            data[at:at] = draw(st.sampled_from(INTERESTING))
        elif op == "overwrite":
            patch = draw(st.sampled_from(INTERESTING))
            data[at:at + len(patch)] = patch
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 16))]
        elif op == "duplicate" and data:
            start = draw(st.integers(0, len(data) - 1))
            data[at:at] = data[start:start + draw(st.integers(1, 32))]
        elif op == "splice":
            other = draw(valid)
            cut = draw(st.integers(0, len(other)))
            data[at:] = other[cut:]
    return bytes(data)


def inputs(valid: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Mostly mutated valid encodings, some untouched ones, some raw bytes."""
    return st.one_of(mutated(valid), mutated(valid), mutated(valid), valid, st.binary(max_size=256))


# --- the guarded parse ---------------------------------------------------------------------------


def guarded(parse: Callable[[], Any], allowed: tuple[type[BaseException], ...]) -> BaseException | None:
    """Run `parse()`; return None on success or the allowed error it raised.

    Fails the test when the parse outlives PARSE_SECONDS (a hang), raises anything outside
    `allowed` (re-raised as is, so the report shows the raw traceback), raises an allowed error
    with an empty message, or allocates more than PEAK_BYTES at its peak.
    """
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            parse()
        except BaseException as exc:  # handed to the test thread, which judges it
            outcome.append(exc)
        else:
            outcome.append(None)

    started = tracemalloc.is_tracing()
    if not started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    worker = threading.Thread(target=run, name="fuzz-parse", daemon=True)
    worker.start()
    worker.join(PARSE_SECONDS)
    _, peak = tracemalloc.get_traced_memory()
    if not started:
        tracemalloc.stop()
    if worker.is_alive():
        raise AssertionError(f"the parse did not finish within {PARSE_SECONDS:g}s (a hang)")
    assert peak <= PEAK_BYTES, f"the parse allocated {peak} bytes at its peak (bound {PEAK_BYTES})"
    error = outcome[0]
    if error is None:
        return None
    if not isinstance(error, allowed):
        raise error
    assert str(error).strip(), f"{type(error).__name__} raised without a message"
    return error
