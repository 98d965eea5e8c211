"""Fuzz manifest loading: manifest.json bytes from a destination are outside input.

Valid manifests (laredo's layout, written by `Manifest.dumps`) are mutated as bytes and as JSON
documents (a field replaced by a value of another type, a field dropped); every outcome is a
Manifest or an ArchiveError, and `validate()` on what loaded raises only CorruptManifest.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from snapshot_assets.archive.errors import ArchiveError, CorruptManifest
from snapshot_assets.archive.manifest import Artifact, FormatRef, Manifest, loads
from snapshot_assets.archive.positions import compare_lsn
from tests.fuzz.support import fuzz_settings, guarded, inputs

positions = st.builds(lambda hi, lo: f"{hi:X}/{lo:08X}", st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
formats = st.dictionaries(st.sampled_from(["jsonl", "protobuf", "parquet", "x"]),
                          st.builds(FormatRef, st.text(max_size=20), st.integers(0, 2**40)), max_size=3)
artifacts = st.builds(
    Artifact, kind=st.sampled_from(["snapshot", "diff"]), epoch=st.integers(0, 5),
    from_position=st.one_of(st.none(), positions), to_position=positions, created_at=st.just("2026-01-01T00:00:00Z"),
    formats=formats, row_count=st.integers(0, 10), change_count=st.integers(0, 10))
manifests = st.builds(Manifest, table=st.text(max_size=12), epoch=st.integers(0, 5), updated_at=st.text(max_size=5),
                      head_position=positions, artifacts=st.lists(artifacts, max_size=4).map(tuple))
valid = manifests.map(Manifest.dumps)

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
              st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6)


@st.composite
def structurally_mutated(draw: st.DrawFn) -> bytes:
    """A valid manifest with one field anywhere in it replaced by an arbitrary JSON value or dropped."""
    doc = json.loads(draw(valid))
    paths: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            paths.append((node, key))
            walk(child)

    walk(doc)
    if paths:
        node, key = draw(st.sampled_from(paths))
        if isinstance(node, dict) and draw(st.booleans()):
            del node[key]
        else:
            node[key] = draw(json_values)
    return json.dumps(doc).encode()


def _load_and_validate(data: bytes) -> None:
    manifest = loads(data, source="fuzz")
    with contextlib.suppress(CorruptManifest):
        manifest.validate(compare_lsn)


@fuzz_settings(300)
@given(inputs(valid))
def test_mutated_bytes_load_or_fail_cleanly(data: bytes) -> None:
    guarded(lambda: _load_and_validate(data), (ArchiveError,))


@fuzz_settings(300)
@given(structurally_mutated())
def test_mutated_fields_load_or_fail_cleanly(data: bytes) -> None:
    guarded(lambda: _load_and_validate(data), (ArchiveError,))


def test_deeply_nested_json_is_a_corrupt_manifest() -> None:
    deep = b'{"manifest_version": 1, "columns": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    error = guarded(lambda: loads(deep, source="fuzz"), (ArchiveError,))
    assert isinstance(error, CorruptManifest), error
    assert "nested deeper than" in str(error)
