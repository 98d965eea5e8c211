"""The manifest (v1): the per-table index and commit point of an archive.

The manifest is a compatibility contract with every consumer, laredo's readers included, so this
module reads anything laredo writes, writes exactly what laredo writes (Go's `MarshalIndent` with a
2-space indent, fields in struct order), and carries unknown fields through a rewrite untouched:
the format evolves additively, and a writer that dropped a field it does not know would undo a
newer writer's work.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from snapshot_assets.archive.errors import CorruptManifest, UnsupportedManifestVersion
from snapshot_assets.archive.gojson import marshal_indent, too_deep
from snapshot_assets.archive.positions import Comparator

MANIFEST_VERSION = 1
SNAPSHOT = "snapshot"
DIFF = "diff"

_MANIFEST_FIELDS = ("manifest_version", "table", "epoch", "updated_at", "head_position", "artifacts", "columns")
_ARTIFACT_FIELDS = ("kind", "epoch", "from_position", "to_position", "created_at", "row_count",
                    "change_count", "formats")
_FORMAT_FIELDS = ("uri", "size_bytes")


def utc_now() -> str:
    """RFC 3339 UTC timestamp with the precision Go's time.Time marshals (nanoseconds, trimmed)."""
    return rfc3339(_dt.datetime.now(_dt.UTC))


def rfc3339(moment: _dt.datetime) -> str:
    """Format like Go's RFC3339Nano: fractional seconds without trailing zeros, `Z` for UTC."""
    moment = moment.astimezone(_dt.UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += "." + f"{moment.microsecond:06d}".rstrip("0")
    return text + "Z"


@dataclass(frozen=True, slots=True)
class FormatRef:
    """One encoded copy of an artifact: where it is and how big."""

    uri: str
    size_bytes: int
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"uri": self.uri, "size_bytes": self.size_bytes, **self.extra}


@dataclass(frozen=True, slots=True)
class Artifact:
    """One committed snapshot or diff. A snapshot has `from_position=None`; a diff covers (from, to]."""

    kind: str
    epoch: int
    from_position: str | None
    to_position: str
    created_at: str
    formats: Mapping[str, FormatRef]
    row_count: int = 0
    change_count: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_snapshot(self) -> bool:
        return self.kind == SNAPSHOT

    @property
    def identity(self) -> tuple[str, int, str | None, str]:
        """What names an artifact across manifest copies and rewrites (its objects' keys follow from it)."""
        return self.kind, self.epoch, self.from_position, self.to_position

    def to_json(self) -> dict[str, Any]:
        """Field order and omissions exactly as laredo's struct tags (`row_count`/`change_count` omitempty)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "epoch": self.epoch,
            "from_position": self.from_position,
            "to_position": self.to_position,
            "created_at": self.created_at,
        }
        if self.row_count:
            out["row_count"] = self.row_count
        if self.change_count:
            out["change_count"] = self.change_count
        out["formats"] = {fid: self.formats[fid].to_json() for fid in sorted(self.formats)}
        out.update(self.extra)
        return out

    def describe(self) -> str:
        """Short human name, used in error messages and CLI output."""
        if self.is_snapshot:
            return f"snapshot@{self.to_position} (epoch {self.epoch})"
        return f"diff {self.from_position}->{self.to_position} (epoch {self.epoch})"


@dataclass(frozen=True, slots=True)
class Manifest:
    table: str
    epoch: int = 0
    updated_at: str = ""
    head_position: str = ""
    artifacts: tuple[Artifact, ...] = ()
    manifest_version: int = MANIFEST_VERSION
    columns: Any = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    # ---- reading -----------------------------------------------------------------------------

    def snapshots(self) -> Iterator[Artifact]:
        return (a for a in self.artifacts if a.is_snapshot)

    def latest_snapshot(self) -> Artifact | None:
        """The snapshot with the highest epoch (laredo's rule; the last one wins a tie)."""
        best: Artifact | None = None
        for a in self.snapshots():
            if best is None or a.epoch >= best.epoch:
                best = a
        return best

    # ---- writing -----------------------------------------------------------------------------

    def with_artifact(self, art: Artifact, *, now: str | None = None, keep_epochs: int = 0,
                      spare: Callable[[Artifact], bool] | None = None) -> Manifest:
        """The manifest after committing `art`: appended, head and epoch advanced, retention applied.

        Retention keeps the current epoch and the `keep_epochs - 1` before it (0 keeps everything);
        the newest snapshot is never pruned because its epoch is the current one. An artifact for
        which `spare` says True stays whatever its epoch (a pinned snapshot: archive/retention.py);
        the chain stays valid because a snapshot needs nothing before it.
        """
        epoch = art.epoch if art.is_snapshot else self.epoch
        artifacts = (*self.artifacts, art)
        if keep_epochs > 0:
            artifacts = tuple(a for a in artifacts
                              if a.epoch >= epoch - keep_epochs + 1 or (spare is not None and spare(a)))
        return replace(self, manifest_version=MANIFEST_VERSION, epoch=epoch, updated_at=now or utc_now(),
                       head_position=art.to_position, artifacts=artifacts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "manifest_version": self.manifest_version,
            "table": self.table,
            "epoch": self.epoch,
            "updated_at": self.updated_at,
            "head_position": self.head_position,
            "artifacts": [a.to_json() for a in self.artifacts],
        }
        if self.columns is not None:
            out["columns"] = self.columns
        out.update(self.extra)
        return out

    def dumps(self) -> bytes:
        """Serialise as laredo does: Go `json.MarshalIndent(m, "", "  ")`, no trailing newline."""
        return marshal_indent(self.to_json())

    # ---- checking ----------------------------------------------------------------------------

    def problems(self, cmp: Comparator | None = None) -> list[str]:
        """Every v1 invariant this manifest breaks, as readable sentences (empty when valid)."""
        return list(_chain_problems(self, cmp))

    def validate(self, cmp: Comparator | None = None) -> None:
        found = self.problems(cmp)
        if found:
            raise CorruptManifest(f"manifest of {self.table or '?'} is invalid: " + "; ".join(found))


def _chain_problems(m: Manifest, cmp: Comparator | None) -> Iterator[str]:
    prev: Artifact | None = None
    current_epoch: int | None = None
    for i, a in enumerate(m.artifacts):
        where = f"artifact #{i} ({a.describe()})"
        if a.to_position == "":
            yield f"{where} has an empty to_position"
        if a.is_snapshot:
            if current_epoch is not None and a.epoch <= current_epoch:
                yield f"{where} does not open a new epoch (previous epoch {current_epoch})"
            if prev is not None and cmp is not None and cmp(a.to_position, prev.to_position) < 0:
                yield f"{where} moves the head backwards from {prev.to_position}"
            current_epoch = a.epoch
        else:
            if not a.from_position:
                yield f"{where} has an empty from_position"
            elif a.from_position == a.to_position:
                yield f"{where} has from_position == to_position"
            elif cmp is not None and cmp(a.to_position, a.from_position) <= 0:
                yield f"{where} ends before it starts"
            if prev is None:
                yield f"{where} comes before any snapshot"
            elif a.from_position != prev.to_position:
                yield (f"{where} does not continue the chain: from_position {a.from_position!r} != "
                       f"previous to_position {prev.to_position!r}")
            if current_epoch is not None and a.epoch != current_epoch:
                yield f"{where} carries epoch {a.epoch} but follows the snapshot of epoch {current_epoch}"
        if not a.formats:
            yield f"{where} lists no formats"
        prev = a
    if m.artifacts:
        last = m.artifacts[-1]
        if m.head_position != last.to_position:
            yield f"head_position {m.head_position!r} != last artifact's to_position {last.to_position!r}"
        if current_epoch is not None and m.epoch != current_epoch:
            yield f"epoch {m.epoch} != epoch of the newest snapshot ({current_epoch})"


# ---- parsing ------------------------------------------------------------------------------------


def loads(data: bytes | str, *, source: str = "manifest") -> Manifest:
    """Parse a manifest, rejecting newer versions and malformed structure with a specific error.

    Chain invariants are not enforced here (see `Manifest.validate`): readers must still be able
    to read laredo archives that carry laredo's known defects, and guard against them instead.
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptManifest(f"{source}: not valid JSON ({e})") from None
    except RecursionError:
        raise CorruptManifest(f"{source}: not valid JSON ({too_deep()})") from None
    if not isinstance(doc, dict):
        raise CorruptManifest(f"{source}: expected a JSON object, got {type(doc).__name__}")
    version = doc.get("manifest_version", 0)
    if version is None:
        version = 0
    if not isinstance(version, int) or isinstance(version, bool):
        raise CorruptManifest(f"{source}: manifest_version must be an integer, got {version!r}")
    if version > MANIFEST_VERSION:
        raise UnsupportedManifestVersion(
            f"{source}: manifest_version {version} is newer than this build supports "
            f"({MANIFEST_VERSION}); upgrade the reader"
        )
    p = _Parser(source)
    artifacts = doc.get("artifacts")
    if artifacts is None:  # Go marshals an empty slice that was never appended to as null
        artifacts = []
    if not isinstance(artifacts, list):
        raise CorruptManifest(f"{source}: artifacts must be a list")
    return Manifest(
        manifest_version=version,
        table=p.string(doc, "table", "", required=False),
        epoch=p.integer(doc, "epoch", "", required=False),
        updated_at=p.string(doc, "updated_at", "", required=False),
        head_position=p.string(doc, "head_position", "", required=False),
        artifacts=tuple(p.artifact(a, f"artifacts[{i}]") for i, a in enumerate(artifacts)),
        columns=doc.get("columns"),
        extra=_extra(doc, _MANIFEST_FIELDS),
    )


def load_artifact(doc: Any, *, source: str = "artifact") -> Artifact:
    """One manifest entry (`Artifact.to_json`'s shape) parsed back, with the manifest's errors."""
    return _Parser(source).artifact(doc, "artifact")


def _extra(doc: Mapping[str, Any], known: Iterable[str]) -> dict[str, Any]:
    names = set(known)
    return {k: v for k, v in doc.items() if k not in names}


class _Parser:
    """Typed field access that names the exact path of a bad field in its error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def _fail(self, path: str, msg: str) -> CorruptManifest:
        return CorruptManifest(f"{self.source}: {path}: {msg}")

    def string(self, doc: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> str:
        value = doc.get(key)
        if value is None and not required:
            return ""
        if not isinstance(value, str):
            raise self._fail(f"{path}{key}", f"expected a string, got {value!r}")
        return value

    def integer(self, doc: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> int:
        value = doc.get(key)
        if value is None and not required:
            return 0
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._fail(f"{path}{key}", f"expected an integer, got {value!r}")
        return value

    def artifact(self, doc: Any, path: str) -> Artifact:
        if not isinstance(doc, dict):
            raise self._fail(path, "expected an object")
        at = path + "."
        kind = self.string(doc, "kind", at)
        if kind not in (SNAPSHOT, DIFF):
            raise self._fail(f"{at}kind", f"unknown artifact kind {kind!r}")
        from_position = doc.get("from_position")
        if from_position is not None and not isinstance(from_position, str):
            raise self._fail(f"{at}from_position", f"expected a string or null, got {from_position!r}")
        formats = doc.get("formats") or {}
        if not isinstance(formats, dict):
            raise self._fail(f"{at}formats", "expected an object")
        return Artifact(
            kind=kind,
            epoch=self.integer(doc, "epoch", at),
            from_position=from_position,
            to_position=self.string(doc, "to_position", at),
            created_at=self.string(doc, "created_at", at, required=False),
            row_count=self.integer(doc, "row_count", at, required=False),
            change_count=self.integer(doc, "change_count", at, required=False),
            formats={fid: self.format_ref(ref, f"{at}formats.{fid}") for fid, ref in formats.items()},
            extra=_extra(doc, _ARTIFACT_FIELDS),
        )

    def format_ref(self, doc: Any, path: str) -> FormatRef:
        if not isinstance(doc, dict):
            raise self._fail(path, "expected an object")
        return FormatRef(
            uri=self.string(doc, "uri", path + ".", required=False),
            size_bytes=self.integer(doc, "size_bytes", path + ".", required=False),
            extra=_extra(doc, _FORMAT_FIELDS),
        )
