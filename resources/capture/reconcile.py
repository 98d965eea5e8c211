"""Reconciliation: storage is the truth, the index is rebuilt from it.

Scans the pages under the key template's fixed prefix, and for every index backend restores the
records of pages it lacks (read from the page itself: its metadata says everything a record
holds) and reports records that name no stored page. Run by the capture reconciliation Dagster job
(snapshot_assets/capture) and by the asset check over the pages.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from resources.capture.flush import StoredPage
from resources.capture.index import Entry, IndexBackend
from resources.capture.keys import INDEX_PREFIX
from resources.capture.pages import decode, page_format
from resources.destinations.base import Destination


@dataclass(frozen=True)
class Reconciled:
    stored: tuple[str, ...]  # every page key in storage
    missing: tuple[tuple[str, int], ...]  # (backend class, records it lacked: restored unless restore=False)
    orphans: tuple[str, ...]  # keys an index names that storage lacks


def template_prefix(template: str) -> str:
    """The fixed text a template's keys start with (everything before the first placeholder)."""
    literal, *_ = next(iter(string.Formatter().parse(template)), ("", None, None, None))
    return literal


def stored_page_keys(destination: Destination, template: str) -> list[str]:
    return [info.key for info in destination.list(template_prefix(template)) if not info.key.startswith(INDEX_PREFIX)]


def read_entry(destination: Destination, key: str) -> Entry | None:
    """The index record of the stored page `key`, from its own bytes (None if it vanished)."""
    got = destination.get(key)
    if got is None:
        return None
    page = decode(got.data)
    return StoredPage(key, page.metadata, len(got.data), page_format(got.data), dead_lettered=False).index_entry()


def reconcile(destination: Destination, targets: Sequence[IndexBackend], template: str, *,
              restore: bool = True) -> Reconciled:
    stored = stored_page_keys(destination, template)
    counts: list[tuple[str, int]] = []
    orphans: set[str] = set()
    for target in targets:
        indexed = target.all_keys()
        missing = [k for k in stored if k not in indexed]
        for key in missing if restore else ():
            entry = read_entry(destination, key)
            if entry is not None:
                target.upsert(entry)
        counts.append((type(target).__name__, len(missing)))
        orphans.update(indexed - set(stored))
    return Reconciled(tuple(stored), tuple(counts), tuple(sorted(orphans)))
