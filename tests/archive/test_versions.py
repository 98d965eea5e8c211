"""The versions objects' text (archive/versions.py): what a writer puts is what a reader gets back,
and a malformed line is a CorruptArtifact naming the object, never a wrong version."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapshot_assets.archive.errors import CorruptArtifact
from snapshot_assets.archive.versions import (
    TRUNCATE_KEY,
    Version,
    diff_lines,
    diff_text,
    line_at,
    parse_version,
    version_text,
)

_TEXT = st.text(st.characters(blacklist_characters="\t\n\r", blacklist_categories=("Cs",)), min_size=1, max_size=30)
positions = st.builds(lambda hi, lo: f"{hi:X}/{lo:X}", st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
versions = st.builds(Version, positions, st.one_of(st.none(), _TEXT), st.booleans())


def _text(v: Version) -> str:
    return version_text(v.position, v.commit_time, v.copied)


@given(versions)
def test_a_version_reads_back_as_written(v: Version) -> None:
    assert parse_version(_text(v), "x") == v


@given(st.lists(st.one_of(st.none(), versions), max_size=40), st.data())
def test_the_line_at_a_rows_place_is_its_version(block: list[Version | None], data: st.DataObject) -> None:
    """A block of a snapshot's versions object: one line per row, empty for an unknown version."""
    raw = "".join(("" if v is None else _text(v)) + "\n" for v in block).encode()
    if not block:
        with pytest.raises(CorruptArtifact, match="0 version line"):
            line_at(raw, 0, "obj")
        return
    i = data.draw(st.integers(0, len(block) - 1))
    assert line_at(raw, i, "obj") == block[i]
    with pytest.raises(CorruptArtifact, match="obj"):
        line_at(raw, len(block), "obj")


@given(st.dictionaries(st.one_of(st.just(TRUNCATE_KEY), _TEXT.map(lambda s: f'["{s}"]')), versions, max_size=30))
def test_a_diffs_versions_object_reads_back_by_key(entries: dict[str, Version]) -> None:
    raw = diff_text((key, _text(v)) for key, v in entries.items())
    assert diff_lines(raw, "obj") == entries
    assert raw.split(b"\n")[:-1] == sorted(raw.split(b"\n")[:-1])  # in key order


@pytest.mark.parametrize("line", ["0/1\t\tmaybe", "0/1\tt", "\t\tchange", "0/1\t2026\tchange\textra"])
def test_a_malformed_version_is_corrupt(line: str) -> None:
    with pytest.raises(CorruptArtifact, match="obj: not a version line"):
        parse_version(line, "obj")


def test_a_diff_line_without_a_version_or_cut_off_is_corrupt() -> None:
    with pytest.raises(CorruptArtifact, match="obj: not a key and version"):
        diff_lines(b'["k"]\n', "obj")
    with pytest.raises(CorruptArtifact, match="obj: the last line is cut off"):
        diff_lines(b'["k"]\t0/1\t\tchange', "obj")
