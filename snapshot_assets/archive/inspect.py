"""A readable rendering of a manifest, for `snapshotter inspect` and run logs."""

from __future__ import annotations

from snapshot_assets.archive.manifest import Manifest
from snapshot_assets.archive.pins import pin_of
from snapshot_assets.archive.retention import retired_of


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} GiB"


def render_manifest(m: Manifest) -> str:
    header = [
        f"table          {m.table}",
        f"manifest       v{m.manifest_version}",
        f"epoch          {m.epoch}",
        f"head_position  {m.head_position}",
        f"updated_at     {m.updated_at}",
        f"artifacts      {len(m.artifacts)}",
        "",
    ]
    cols = ("#", "kind", "epoch", "from", "to", "count", "formats (size)", "created_at", "pin")
    rows = [cols]
    for i, a in enumerate(m.artifacts):
        count = a.row_count if a.is_snapshot else a.change_count
        fmts = ", ".join(f"{fid} ({_size(ref.size_bytes)})" for fid, ref in a.formats.items())
        pin = pin_of(a)
        rows.append((str(i), a.kind, str(a.epoch), a.from_position or "-", a.to_position, str(count),
                     fmts, a.created_at, f"{pin.label} ({pin.origin})" if pin else ""))
    widths = [max(len(r[c]) for r in rows) for c in range(len(cols))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    retired = retired_of(m)
    waiting = [f"retired        {r.artifact.describe()} at {r.retired_at} (objects kept for retention.grace)"
               for r in retired]
    return "\n".join([*header, *lines, *([""] if waiting else []), *waiting]) + "\n"
