"""Errors every subscriber raises: each names the table and the cause, and says whether to retry.

The ingest loop only needs one decision per failure: retry later (the source is down, restarting,
busy, or the connection dropped) or stop and tell an operator (bad credentials, unknown table, no
primary key, a lost replication slot). `transient` carries that decision, so the loop never parses
messages. The hierarchy is source-neutral: the PostgreSQL source and the laredo fan-out client
raise the same classes.
"""

from __future__ import annotations

from collections.abc import Sequence

from snapshot_assets.redaction import redact


class SourceError(Exception):
    """A source failed for `table` because of `cause`; `transient` says whether retrying may help.

    Subclasses fix the default of `transient`; an instance may override it when the same kind of
    failure can be either (a malformed frame after a network hiccup is worth one retry).
    """

    default_transient = False

    def __init__(self, table: str, cause: str, *, transient: bool | None = None) -> None:
        self.table = table
        self.cause = redact(cause)  # causes quote drivers and servers, which may echo credentials
        self.transient = self.default_transient if transient is None else transient
        super().__init__(f"{table}: {self.cause}")


class SourceUnavailable(SourceError):
    """The source cannot be reached right now (refused, timed out, restarting, connection lost)."""

    default_transient = True


class SourceConfigError(SourceError):
    """The configuration cannot work as given (credentials, privileges, server settings, names)."""


class UnknownTable(SourceConfigError):
    """The table does not exist on the source (or is not visible to the configured user)."""


class NoPrimaryKey(SourceConfigError):
    """The table has no primary key, so changes cannot be keyed and diffs cannot be computed."""


class KeyMismatch(SourceConfigError):
    """The configured `key_fields` are not the key the source reports for the table.

    Folding by other columns than the source's key merges distinct rows or splits one row, so the
    run refuses to start and names both.
    """

    def __init__(self, table: str, configured: Sequence[str], reported: Sequence[str], what: str,
                 detail: str = "") -> None:
        super().__init__(table, f"key_fields {_names(configured)} do not match the {what} {_names(reported)} "
                                f"of {table}" + (f" ({detail})" if detail else ""))
        self.configured = tuple(configured)
        self.reported = tuple(reported)


def _names(fields: Sequence[str]) -> str:
    return "[" + ", ".join(fields) + "]"


class SlotLost(SourceError):
    """The replication slot (or the source's journal) no longer covers the resume position.

    Changes after the last durable position are gone from the source: continuing would silently
    drift. Recovery is a full re-sync, which is an operator's (or a configured) decision.
    """


class SlotInUse(SourceError):
    """Another consumer holds the replication slot; usually a previous process still shutting down."""

    default_transient = True


class ProtocolError(SourceError):
    """The source sent something this client cannot decode (an unknown message, a truncated frame)."""


class PositionRegression(SourceError):
    """A source position went backwards: applying it would break the buffer's ordering invariant."""
