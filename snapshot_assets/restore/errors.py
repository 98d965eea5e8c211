"""The one error type of a restore: what the operator must change (a label, a position, a name, a
DSN), said in one line. A RuntimeError, so every command line and job reports it as a failure."""

from __future__ import annotations


class RestoreError(RuntimeError):
    """A restore that cannot be done as asked; nothing was written under the target's name."""
