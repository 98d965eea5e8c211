"""The row and change model shared by every format, the change algebra and the reader.

A row is a JSON-like mapping (str keys; values str, int, float, bool, None, nested dict/list, and
bytes/datetime which formats encode the way Go's encoding/json does). Integers are Python ints, so
values beyond 2^53 stay exact everywhere they can.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]


class Action(enum.StrEnum):
    """Change actions, spelled exactly as laredo writes them."""

    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    TRUNCATE = "TRUNCATE"


@dataclass(frozen=True, slots=True)
class Change:
    """One change of a diff: laredo's `{action, key, old?, new?}`.

    `key` is the Go-`%v` key string laredo writes; readers of this project do not trust it for
    identity (see `keys.typed_key`), but writers must produce it for laredo's readers.
    """

    action: Action
    key: str = ""
    old: Row | None = None
    new: Row | None = None

    @staticmethod
    def parse_action(value: str) -> Action:
        """Map a wire action string to `Action`, with a clear error for anything else."""
        try:
            return Action(value)
        except ValueError:
            raise ValueError(f"unknown change action {value!r}; expected one of "
                             f"{', '.join(a.value for a in Action)}") from None


def as_row(value: Mapping[str, Any] | None) -> Row | None:
    """Normalise an optional mapping to a plain dict, treating an empty one as absent (laredo omits it)."""
    if not value:
        return None
    return dict(value)
