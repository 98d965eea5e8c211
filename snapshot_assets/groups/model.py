"""A co-refresh group as the configuration declares it: `groups = [ { name, tables, ... } ]`.

Why a group exists: each table has its own replication slot, buffer and chain, so each table's
artifact boundaries fall where that table changed. Reading two tables "as of P" then gives each
table at its own last boundary at or before P, two different moments, and a transaction that
touched both is seen half. A group's members are only ever archived to common positions (cuts),
and the group manifest names the cuts a reader may use.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass

GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
"""A group name is a Dagster run-key and tag component and a key-prefix folder: plain characters."""


def default_group_prefix(name: str) -> str:
    """Where a group's manifest lives when `key_prefix` is not set: `groups/<name>/` (beside the
    tables' own `<table>/` folders, never one of them)."""
    return f"groups/{name}/"


@dataclass(frozen=True)
class GroupConfig:
    """One group: its members (`schema.table`, in the configured order), where its manifest lives,
    and how often it cuts (`diff.interval`; by default the shortest of its members')."""

    name: str
    tables: tuple[str, ...]
    key_prefix: str
    diff_interval: _dt.timedelta
