"""Errors of the archive contract.

Every failure a reader or writer can meet has its own type, so callers (the CLI, Dagster asset
checks, sensors) can tell "the archive cannot answer this" from "the archive is damaged" and print
one specific line instead of a traceback.
"""

from __future__ import annotations


class ArchiveError(Exception):
    """Base class: something about an archive (manifest, artifact, position) is wrong."""


class ManifestNotFound(ArchiveError):
    """No manifest exists at the expected key: the table was never archived there."""


class UnsupportedManifestVersion(ArchiveError):
    """The manifest was written by a newer schema; guessing at it could silently lose data."""


class CorruptManifest(ArchiveError):
    """The manifest is not valid JSON, or breaks a v1 invariant (chain, positions, head)."""


class CorruptArtifact(ArchiveError):
    """An artifact object cannot be decoded by its declared format."""


class MissingArtifact(ArchiveError):
    """An artifact referenced by the manifest is absent from the destination."""


class PositionError(ArchiveError):
    """A requested position cannot be served by the archive (before its first snapshot, unparseable)."""


class UnknownFormat(ArchiveError):
    """A format id that no implementation is registered for."""


class MissingKeyField(ArchiveError, ValueError):
    """A row lacks one of the table's key fields, so it names no row.

    Never folded under a `<nil>` key: every such row would collapse into one (a table keyed
    `user_id` read with key fields `[id]` would keep one row). Callers add the table and position.
    """

    def __init__(self, field: str, key_fields: tuple[str, ...], where: str = "") -> None:
        what = f"lacks key field {field!r} (key fields {list(key_fields)})"
        super().__init__(f"{where} {what}" if where else what)
        self.field = field
        self.key_fields = key_fields

    def at(self, where: str) -> MissingKeyField:
        """The same error, saying which row: `where` is its subject ("INSERT at 0/16B3748: the new row")."""
        return MissingKeyField(self.field, self.key_fields, where)


class EncodeError(ArchiveError):
    """A value cannot be represented in a format (NaN, Infinity, an unsupported type).

    The message always names the column and the row key so the operator can find the row.
    """

    def __init__(self, message: str, *, column: str | None = None, row_key: str | None = None) -> None:
        where = []
        if column is not None:
            where.append(f"column {column!r}")
        if row_key is not None:
            where.append(f"row key {row_key!r}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.column = column
        self.row_key = row_key
