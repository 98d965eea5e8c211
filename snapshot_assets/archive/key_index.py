"""The snapshot key index: which small byte range of a snapshot object can hold a given key.

Why: a snapshot built from the bucketed state is the concatenation of its buckets in key order,
each bucket's rows sorted by the sort key (`archive/sortkey.py`), so the jsonl and protobuf
objects are sorted by key. A sparse list of (sort key of a row, where that row starts in each byte
format) every `BLOCK_BYTES` of jsonl turns a key into one range of about `BLOCK_BYTES`: a lookup
reads the index and that range, not the snapshot (`archive/lookup.py`).

The entries are made by the tasks that write each bucket (bucket-relative offsets, kept with the
bucket in the state), so a re-base that copies an unchanged bucket's bytes also keeps its entries;
the driver only shifts them by each bucket's start in the object (`KeyIndex.of_buckets`).

The same entries also give each marked row's offset in the snapshot's versions object (one line
per row, archive/versions.py), so the version of a row found at place j of a block is on line j of
the same block there.

The object sits beside its snapshot, `<snapshot key without extension>.keyindex.json` (one JSON
document, `docs/archive-format.md`): laredo's readers never list an epoch folder, so they do not
see it; retention deletes it with its snapshot (`pipeline/commit.py`).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snapshot_assets.archive import keys
from snapshot_assets.archive.errors import ArchiveError

INDEX_VERSION = 1
INDEX_EXTENSION = ".keyindex.json"
#: Where entries fall: the first row starting in each block of a bucket's jsonl (its protobuf when
#: the archive has no jsonl). 64 KiB keeps a 10M-row index under 1 MiB and a range read small.
BLOCK_BYTES = 64 * 1024
MIN_BLOCK_BYTES = 256


def block_bytes_for(bucket_bytes: int) -> int:
    """The block size for buckets of about `bucket_bytes`: BLOCK_BYTES, or smaller so that a bucket
    has at least 16 entries (small test buckets get an in-bucket index too)."""
    return max(MIN_BLOCK_BYTES, min(BLOCK_BYTES, bucket_bytes // 16))

#: One bucket's entries: the sort keys of its marked rows and, per byte format, where they start
#: within the bucket's bytes.
BucketEntries = tuple[tuple[bytes, ...], Mapping[str, tuple[int, ...]]]


def index_key(key_prefix: str, epoch: int, to_position: str) -> str:
    """The object key of the key index of the snapshot at `to_position` in `epoch`."""
    return keys.snapshot_key(key_prefix, epoch, to_position, INDEX_EXTENSION)


def entries_to_json(entries: BucketEntries) -> dict[str, Any]:
    sks, offsets = entries
    return {"sk": [sk.hex() for sk in sks], "offsets": {fid: list(o) for fid, o in offsets.items()}}


def entries_from_json(data: Mapping[str, Any]) -> BucketEntries:
    return (tuple(bytes.fromhex(s) for s in data["sk"]),
            {str(fid): tuple(int(v) for v in o) for fid, o in data["offsets"].items()})


class UnusableIndex(ArchiveError):
    """A key index object that cannot be used (unreadable, another version, or not this snapshot's)."""


@dataclass(frozen=True, slots=True)
class KeyIndex:
    """Sorted sparse entries over one snapshot's byte objects: `sks[i]` is the sort key (in hex) of
    the row that starts at `offsets[fmt][i]` in the object of format `fmt` (`sizes[fmt]` bytes long).

    The sort keys stay hex, as stored: lower-case hex orders exactly as the bytes do, so a lookup
    bisects the loaded list without converting 10M rows' worth of entries first."""

    key_fields: tuple[str, ...]
    position: str
    sks: Sequence[str]
    offsets: Mapping[str, Sequence[int]]
    sizes: Mapping[str, int]

    @classmethod
    def of_buckets(cls, key_fields: Sequence[str], position: str, buckets: Sequence[BucketEntries],
                   sizes: Sequence[Mapping[str, int]]) -> KeyIndex:
        """The index of an object made of `buckets` in order (`sizes`: each bucket's bytes per format)."""
        formats = sorted({fid for s in sizes for fid in s})
        sks: list[str] = []
        offsets: dict[str, list[int]] = {fid: [] for fid in formats}
        starts = dict.fromkeys(formats, 0)
        for (bucket_sks, bucket_offsets), bucket_sizes in zip(buckets, sizes, strict=True):
            sks.extend(sk.hex() for sk in bucket_sks)
            for fid in formats:
                offsets[fid].extend(starts[fid] + o for o in bucket_offsets.get(fid, ()))
                starts[fid] += bucket_sizes.get(fid, 0)
        return cls(tuple(key_fields), position, tuple(sks), {f: tuple(o) for f, o in offsets.items()}, starts)

    def entry(self, sk: bytes) -> int | None:
        """The entry whose block can hold the row whose sort key is `sk`; None when the key sorts
        before every row (it is not in the snapshot)."""
        i = bisect.bisect_right(self.sks, sk.hex()) - 1
        return None if i < 0 else i

    def span(self, entry: int, format_id: str) -> tuple[int, int]:
        """(start, length) of entry `entry`'s block in the `format_id` object (the same rows in every
        object the index covers: a row's place in one block is its place in the others)."""
        offsets = self.offsets[format_id]
        end = offsets[entry + 1] if entry + 1 < len(offsets) else self.sizes[format_id]
        return offsets[entry], end - offsets[entry]

    def block(self, sk: bytes, format_id: str) -> tuple[int, int] | None:
        """(start, length) of the only range of the `format_id` object that can hold the row whose
        sort key is `sk`; None when the key sorts before every row (it is not in the snapshot)."""
        entry = self.entry(sk)
        return None if entry is None else self.span(entry, format_id)

    def dumps(self) -> bytes:
        return json.dumps({"key_index_version": INDEX_VERSION, "key_fields": list(self.key_fields),
                           "position": self.position, "block_bytes": BLOCK_BYTES, "sizes": dict(self.sizes),
                           "sk": list(self.sks),
                           "offsets": {fid: list(o) for fid, o in self.offsets.items()}},
                          separators=(",", ":")).encode()

    @classmethod
    def loads(cls, data: bytes, source: str) -> KeyIndex:
        try:
            doc = json.loads(data)
            if doc.get("key_index_version") != INDEX_VERSION:
                raise UnusableIndex(f"{source}: key index version {doc.get('key_index_version')!r}, "
                                  f"this reader knows {INDEX_VERSION}")
            index = cls(tuple(doc["key_fields"]), str(doc["position"]), doc["sk"],
                        {str(f): o for f, o in doc["offsets"].items()},
                        {str(f): int(v) for f, v in doc["sizes"].items()})
            if not isinstance(index.sks, list) or not all(isinstance(o, list) for o in index.offsets.values()):
                raise UnusableIndex(f"{source}: the key index's entries are not lists")
        except UnusableIndex:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UnusableIndex(f"{source}: not a key index ({exc})") from exc
        if any(len(o) != len(index.sks) for o in index.offsets.values()):
            raise UnusableIndex(f"{source}: the offsets and sort keys of the key index differ in length")
        return index
