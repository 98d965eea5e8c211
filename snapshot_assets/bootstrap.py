"""Bootstrap by position: which artifacts bring a replica to the head, as URLs it can GET anonymously.

A new replica (no position) gets the newest snapshot and every diff after it; a replica that
applied everything up to a boundary P gets only the diffs after P; a P the archive can no longer
serve incrementally (its diffs were pruned by a re-base, or P is no boundary) gets a snapshot
again. The choice is the reader's forward-resume plan (archive/reader.py `plan`, spec §8), so a
bootstrap answer and a reconstruction never disagree.

Each artifact's objects are handed out as URLs that need no credentials: presigned S3 GET URLs
(signed by the destination's own client, so its credentials profile) valid for `expires`, or
`file://` URLs on a local destination. A URL may expire in the middle of a long download; the
answer says when (`expires_at`), and the client asks again with the last position it applied:
the new answer continues from there. Objects that leave the manifest (a re-base) stay for
`retention.grace` (archive/retention.py), so a URL handed out just before still works.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from resources.destinations.base import Destination, DestinationError
from resources.destinations.s3 import S3Destination
from snapshot_assets.archive.errors import ArchiveError, PositionError
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.manifest import Artifact, Manifest, rfc3339
from snapshot_assets.archive.pins import pin_of
from snapshot_assets.archive.positions import Comparator, compare_lsn, parse_lsn
from snapshot_assets.archive.reader import ArchiveReader, artifact_key, plan
from snapshot_assets.config_values import ValueParseError, parse_duration
from snapshot_assets.counters import unwrap

if TYPE_CHECKING:
    from snapshot_assets.pipeline.table import TablePipeline

DEFAULT_EXPIRES_S = 3600
MAX_EXPIRES_S = 7 * 24 * 3600  # the longest a SigV4 presigned URL may live


class BootstrapError(ArchiveError, ValueError):
    """A bootstrap request that cannot be answered as asked (bad expires, unknown destination)."""


class UnknownTable(BootstrapError, LookupError):
    """The table is not configured here."""


def parse_expires(text: str | None) -> int:
    """`expires` in whole seconds: plain seconds (`3600`) or a duration (`1h`, `90m`), 1 s to 7 days."""
    if text is None or text == "":
        return DEFAULT_EXPIRES_S
    try:
        seconds = parse_duration(int(text) if text.strip().isdigit() else text).total_seconds()
    except ValueParseError as e:
        raise BootstrapError(f"expires: {e}") from None
    if not 1 <= seconds <= MAX_EXPIRES_S:
        raise BootstrapError(f"expires {text!r} must be between 1s and 7 days ({MAX_EXPIRES_S} s), "
                             "the longest a presigned URL may live")
    return int(seconds)


def download_url(dest: Destination, key: str, expires_s: int) -> str:
    """A credential-free URL of `key` on `dest`: presigned on S3, the file URL on a local destination."""
    inner = unwrap(dest)
    if isinstance(inner, S3Destination):
        return inner.presigned_get(key, expires_s)
    uri = dest.uri(key)
    if uri.startswith("file://"):
        return uri
    raise DestinationError(f"destination {dest.name!r} cannot hand out a URL for {uri}")


def answer(dest: Destination, key_prefix: str, position: str | None, expires_s: int, *,
           cmp: Comparator = compare_lsn, now: _dt.datetime | None = None) -> dict[str, Any]:
    """The bootstrap answer for a consumer at `position` (None: a new replica), from `dest`'s own
    manifest copy (the URLs name its objects). JSON-ready; see docs/operations.md for the schema."""
    if position is not None and cmp is compare_lsn and parse_lsn(position) is None:
        raise PositionError(f"position {position!r} is not a PostgreSQL LSN (expected HI/LO in hex, e.g. 0/16B3748)")
    m = ArchiveReader(dest, key_prefix, cmp=cmp).load_manifest()
    if position is not None and m.head_position and cmp(position, m.head_position) > 0:
        raise PositionError(f"position {position} is after the head {m.head_position} of {m.table}: "
                            "it was not read from this archive")
    p = plan(m, position or "", cmp)
    if p is None:
        raise PositionError(f"{m.table} has no committed snapshot yet: nothing to bootstrap from")
    moment = now or _dt.datetime.now(_dt.UTC)
    arts = ([p.snapshot] if p.snapshot is not None else []) + list(p.diffs)
    return {
        "table": m.table,
        "position": position,
        "head_position": p.head_position,
        "mode": "snapshot" if p.snapshot is not None else "diffs",
        "expires_at": rfc3339(moment + _dt.timedelta(seconds=expires_s)),
        "expires_in": expires_s,
        "destination": dest.name,
        "artifacts": [_artifact(dest, key_prefix, m, a, expires_s) for a in arts],
    }


def _artifact(dest: Destination, key_prefix: str, m: Manifest, art: Artifact, expires_s: int) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": art.kind, "epoch": art.epoch, "from_position": art.from_position,
                           "to_position": art.to_position}
    if art.is_snapshot:
        out["row_count"] = art.row_count
    else:
        out["change_count"] = art.change_count
    pin = pin_of(art)
    if pin is not None:
        out["label"] = pin.label
    out["formats"] = {fid: {"url": download_url(dest, artifact_key(key_prefix, art, FORMATS[fid]), expires_s),
                            "size_bytes": ref.size_bytes}
                      for fid, ref in sorted(art.formats.items()) if fid in FORMATS}
    return out


class Bootstrapper:
    """Bootstrap answers for the configured tables (the HTTP route and the CLI share it)."""

    def __init__(self, pipes: Sequence[TablePipeline]) -> None:
        self.pipes: Mapping[str, TablePipeline] = {p.name: p for p in pipes}

    def pipe(self, table: str) -> TablePipeline:
        for name, pipe in self.pipes.items():
            if table in (name, pipe.cfg.source.table):
                return pipe
        raise UnknownTable(f"unknown table {table!r}: the configured tables are {', '.join(self.pipes) or 'none'}")

    def answer(self, table: str, position: str | None = None, expires: str | None = None,
               destination: str | None = None) -> dict[str, Any]:
        """The answer for `table` from its first destination (or the one named `destination`)."""
        pipe = self.pipe(table)
        expires_s = parse_expires(expires)
        dest = pipe.destinations[0]
        if destination:
            named = [d for d in pipe.destinations if d.name == destination]
            if not named:
                raise BootstrapError(f"{pipe.name} has no destination {destination!r} "
                                     f"(it has {', '.join(d.name for d in pipe.destinations)})")
            dest = named[0]
        return answer(dest, pipe.cfg.key_prefix, position or None, expires_s, cmp=pipe.cmp)
