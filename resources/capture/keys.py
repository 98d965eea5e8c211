"""Page keys from `storage.key_template`: the one rule that names a page.

A page is named by its writer and its first event (sequence and timestamp), never by the time it
is flushed, so a retried or recovered flush of the same events writes the same key and replaces
the object instead of adding a second copy. The template must therefore contain `{writer_id}` and
`{sequence}`; any placeholder outside the RFC's list is refused when the configuration loads.
"""

from __future__ import annotations

import datetime as dt
import string
from urllib.parse import quote

PLACEHOLDERS = ("year", "month", "day", "date", "writer_id", "timestamp", "sequence")
REQUIRED = ("writer_id", "sequence")
INDEX_PREFIX = "_index/"  # the object index lives here, beside the pages (index.py)


class KeyTemplateError(ValueError):
    """The key template names an unknown placeholder, lacks a required one, or is malformed."""


def check_template(template: str) -> None:
    """Raise KeyTemplateError unless every placeholder is known and the required ones are present."""
    try:
        parsed = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise KeyTemplateError(f"key_template {template!r} is malformed: {e}") from None
    for name, spec, conv in parsed:
        if spec or conv:
            raise KeyTemplateError(f"key_template {template!r}: placeholders take no format or conversion "
                                   f"({{{name}{'!' + conv if conv else ''}{':' + spec if spec else ''}}})")
    fields = [name for name, _, _ in parsed]
    for name in fields:
        if name not in PLACEHOLDERS:
            raise KeyTemplateError(f"key_template {template!r}: unknown placeholder {{{name}}} "
                                   f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
    missing = [p for p in REQUIRED if p not in fields]
    if missing:
        raise KeyTemplateError(f"key_template {template!r} must contain {{{missing[0]}}}: a page's key is its "
                               "writer and first sequence, so retried flushes replace instead of duplicating")
    if template.startswith(INDEX_PREFIX):
        raise KeyTemplateError(f"key_template {template!r} must not start with {INDEX_PREFIX!r} (the object index)")


def writer_path(writer_id: str) -> str:
    """A writer id as one safe key segment (no `/`, no `..`)."""
    return quote(writer_id, safe="-_.@") if writer_id not in (".", "..") else quote(writer_id, safe="")


def page_key(template: str, writer_id: str, first_sequence: int, first_timestamp_ms: int) -> str:
    """The key of the page whose first event is (`first_sequence`, `first_timestamp_ms`)."""
    when = dt.datetime.fromtimestamp(first_timestamp_ms / 1000, tz=dt.UTC)
    return template.format(year=f"{when.year:04d}", month=f"{when.month:02d}", day=f"{when.day:02d}",
                           date=when.strftime("%Y-%m-%d"), writer_id=writer_path(writer_id),
                           timestamp=first_timestamp_ms, sequence=f"{first_sequence:020d}")
