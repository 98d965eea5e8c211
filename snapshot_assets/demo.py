"""`snapshotter demo`: the whole product on embedded defaults, in one command.

The generator source (deterministic, seeded) feeds the change buffer in cycles; after each cycle
the same decisions the re-base trigger sensor makes are materialized through the Dagster assets
(Spark builds the artifacts, the manifest commits them). The policy makes the archive re-base at
least once. At the end the manifest is printed, verified, and the table rebuilt at the head from
each format is compared with the generator's own model of the table at that position. Runs are
recorded in the Dagster instance under the demo directory, so `dagster dev` shows them.

What it prints is the live view (`progress`, fed by `run_output`) and the results; Dagster's event
log goes to `events.log` in the demo directory. Its last lines say what it leaves running: the
local Spark Connect server, kept warm for the next run and stopped by its watchdog after the
configured idle time (the demo directory is recreated around that server's state, not through it,
so a second demo reuses the warm server instead of killing it).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from resources.destinations.factory import build_destination
from snapshot_assets.archive.inspect import render_manifest
from snapshot_assets.archive.keys import typed_key
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.verify import verify_archive
from snapshot_assets.config import DEFAULT_CONFIG, TableConfig, load_config
from snapshot_assets.spark.connect_server import DEFAULT_STATE_DIR, server_status

if TYPE_CHECKING:
    from snapshot_assets.run_output import RunOutput

REPO = Path(__file__).resolve().parent.parent


def prepare(workdir: Path) -> None:
    """A fresh demo directory, and the environment that points config and Dagster at it."""
    _empty(workdir, keep=DEFAULT_STATE_DIR.absolute())
    (workdir / "dagster").mkdir(parents=True)
    shutil.copy(REPO / "dagster.yaml", workdir / "dagster" / "dagster.yaml")
    os.environ["SNAPSHOTTER_CONFIG"] = str(DEFAULT_CONFIG)
    os.environ["SNAPSHOTTER_ARCHIVE"] = str(workdir / "archive")
    os.environ["SNAPSHOTTER_BUFFER"] = str(workdir / "buffer")
    os.environ["DAGSTER_HOME"] = str(workdir / "dagster")


def _empty(directory: Path, keep: Path) -> None:
    """Delete everything under `directory` except `keep` (and the folders on the way to it)."""
    if not directory.is_dir():
        shutil.rmtree(directory, ignore_errors=True)
        return
    for child in directory.iterdir():
        if child == keep:
            continue
        if child.is_dir() and not child.is_symlink() and keep.is_relative_to(child):
            _empty(child, keep)
        elif child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def left_running(state_dir: Path = DEFAULT_STATE_DIR) -> str:
    """The demo's last line: what it leaves running, and for how long."""
    status = server_status(state_dir)
    if status is None:
        return "left running: nothing"
    rss = f", {status.rss_bytes / 2**30:.1f} GiB" if status.rss_bytes else ""
    return (f"left running: the local Spark Connect server (pid {status.info.pid}{rss}) for warm runs; it stops "
            f"{status.stop_rule()}; `snapshotter spark stop` ends it now")


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


def run_demo(out: TextIO, *, workdir: Path, cycles: int = 5, per_cycle: int = 3000,
             log_path: Path | None = None) -> int:
    """The demo; its event log goes to `log_path` (None: to the terminal, as `--verbose` asks)."""
    from snapshot_assets.run_output import command_output

    prepare(workdir)  # before the code location loads: it reads the environment set here
    with command_output(out, log_path) as output:
        ok = _run(output, workdir, cycles, per_cycle)
    return 0 if ok else 1


def _run(output: RunOutput, workdir: Path, cycles: int, per_cycle: int) -> bool:
    import dagster as dg

    from resources.subscribers.generator import GeneratorSubscriber
    from snapshot_assets.run_once import InProcessRuns, catch_up, ingest_until_caught_up
    from snapshot_assets.tables import pipeline

    config = load_config()
    table = config.tables[0]
    runs = InProcessRuns(dg.DagsterInstance.get)
    say = output.view.line
    say(f"demo: {table.name} from the generator, {cycles} cycles of {per_cycle} changes, "
        f"archive in {workdir / 'archive'}")
    for cycle in range(1, cycles + 1):
        ingest_until_caught_up(with_changes(table, cycle * per_cycle), view=output.view)
        catch_up(runs, table.name, output=output)
    key_fields = pipeline(table.name).key_fields
    reader = ArchiveReader(build_destination(table.destinations[0]), table.key_prefix, key_fields=key_fields)
    manifest = reader.load_manifest()
    say("\n" + render_manifest(manifest).rstrip("\n"))
    problems = verify_archive(reader, manifest, deep=True)
    say("verify: " + ("ok" if not problems else "; ".join(problems)))
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
        say(f"rebuilt at head {rec.position} from {fid}: {len(got)} rows, "
            f"{'equals' if match else 'DIFFERS FROM'} the source table")
    say(f"\nsee it in the UI: DAGSTER_HOME={workdir / 'dagster'} SNAPSHOTTER_ARCHIVE={workdir / 'archive'} "
        f"SNAPSHOTTER_BUFFER={workdir / 'buffer'} .venv/bin/dagster dev -w workspace.yaml")
    say(left_running())
    return ok
