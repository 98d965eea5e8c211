"""`snapshotter demo`: the whole product on embedded defaults, in one command.

The generator source (deterministic, seeded) feeds the change buffer in cycles; after each cycle
the same decisions the re-base trigger sensor makes are materialized through the Dagster assets
(Spark builds the artifacts, the manifest commits them). The policy makes the archive re-base at
least once. At the end the manifest is printed, verified, and the table rebuilt at the head from
each format is compared with the generator's own model of the table at that position. Runs are
recorded in the Dagster instance under the demo directory, so `dagster dev` shows them.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import TextIO

from resources.destinations.factory import build_destination
from snapshot_assets.archive.inspect import render_manifest
from snapshot_assets.archive.keys import typed_key
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.verify import verify_archive
from snapshot_assets.config import DEFAULT_CONFIG, TableConfig, load_config

REPO = Path(__file__).resolve().parent.parent


def prepare(workdir: Path) -> None:
    """A fresh demo directory, and the environment that points config and Dagster at it."""
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "dagster").mkdir(parents=True)
    shutil.copy(REPO / "dagster.yaml", workdir / "dagster" / "dagster.yaml")
    os.environ["SNAPSHOTTER_CONFIG"] = str(DEFAULT_CONFIG)
    os.environ["SNAPSHOTTER_ARCHIVE"] = str(workdir / "archive")
    os.environ["SNAPSHOTTER_BUFFER"] = str(workdir / "buffer")
    os.environ["DAGSTER_HOME"] = str(workdir / "dagster")


def with_changes(table: TableConfig, changes: int) -> TableConfig:
    """The table's generator source bounded at `changes` (the stream is a prefix of the longer one)."""
    source = dataclasses.replace(table.source, generator={**table.source.generator, "changes": changes})
    return dataclasses.replace(table, source=source)


def same_rows(got: dict[object, dict[str, object]], expected: dict[object, dict[str, object]]) -> bool:
    """Equal tables, where protobuf's decimal strings for integers beyond 2^53 equal those integers."""
    def norm(row: dict[str, object]) -> dict[str, object]:
        return {k: (str(v) if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**53 else v)
                for k, v in row.items()}
    return got.keys() == expected.keys() and all(norm(got[k]) == norm(expected[k]) for k in got)


def run_demo(out: TextIO, *, workdir: Path, cycles: int = 5, per_cycle: int = 3000) -> int:
    prepare(workdir)  # before the code location loads: it reads the environment set here
    import dagster as dg

    from resources.subscribers.generator import GeneratorSubscriber
    from snapshot_assets.definitions import defs
    from snapshot_assets.run_once import catch_up, ingest_until_caught_up
    from snapshot_assets.tables import pipeline

    config = load_config()
    table = config.tables[0]
    instance = dg.DagsterInstance.get()
    out.write(f"demo: {table.name} from the generator, {cycles} cycles of {per_cycle} changes, "
              f"archive in {workdir / 'archive'}\n")
    for cycle in range(1, cycles + 1):
        ingested = ingest_until_caught_up(with_changes(table, cycle * per_cycle))
        outcome = catch_up(defs, table.name, instance=instance)
        out.write(f"cycle {cycle}: buffer at {ingested}; wrote {', '.join(outcome.artifacts) or 'nothing'}\n")
    key_fields = pipeline(table.name).key_fields
    reader = ArchiveReader(build_destination(table.destinations[0]), table.key_prefix, key_fields=key_fields)
    manifest = reader.load_manifest()
    out.write("\n" + render_manifest(manifest) + "\n")
    problems = verify_archive(reader, manifest, deep=True)
    out.write("verify: " + ("ok" if not problems else "; ".join(problems)) + "\n")
    model = GeneratorSubscriber(table.name, **{**table.source.generator, "changes": cycles * per_cycle})
    expected = model.table_at(manifest.head_position)
    ok = not problems and sum(a.is_snapshot for a in manifest.artifacts) >= 2
    for fid in table.snapshot_formats:
        one_format = ArchiveReader(reader.dest, table.key_prefix, formats=[fid], key_fields=key_fields)
        rec = one_format.reconstruct_as_of()
        assert rec is not None
        got = {typed_key(r, key_fields): r for r in rec.rows}
        match = same_rows(got, expected)  # type: ignore[arg-type]
        ok = ok and match
        out.write(f"rebuilt at head {rec.position} from {fid}: {len(got)} rows, "
                  f"{'equals' if match else 'DIFFERS FROM'} the source table\n")
    out.write(f"\nsee it in the UI: DAGSTER_HOME={workdir / 'dagster'} SNAPSHOTTER_ARCHIVE={workdir / 'archive'} "
              f"SNAPSHOTTER_BUFFER={workdir / 'buffer'} .venv/bin/dagster dev -w workspace.yaml\n")
    return 0 if ok else 1
