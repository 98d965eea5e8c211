"""Helpers of the tests that run the product under a real `dagster-daemon`: the setup files, the
daemon process, waiting for runs, and the source oracle (the archive rebuilt equals the generator)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Final

import dagster as dg

from resources.subscribers.factory import build_subscriber
from resources.subscribers.generator import GeneratorSubscriber
from snapshot_assets.archive.positions import compare_lsn
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.config import TableConfig
from snapshot_assets.pipeline.table import TablePipeline
from tests.aws.pipeline_support import equals_model
from tests.e2e.conftest import REPO
from tests.e2e.http_support import poll
from tests.e2e.test_dagster_daemon import Service, ended_status, run_status

TABLE: Final = "public.users"
RUN_DEADLINE_S: Final = 300.0  # a Spark run on a loaded 2-core machine


def setup(work: Path) -> tuple[Path, Path, Path]:
    """DAGSTER_HOME, workspace file and snapshotter config under `work`."""
    home = work / "dagster_home"
    home.mkdir()
    text = (REPO / "dagster.yaml").read_text().replace("run_queue:\n", "run_queue:\n  dequeue_interval_seconds: 1\n", 1)
    (home / "dagster.yaml").write_text(text + "\nsensors:\n  use_threads: true\n  num_workers: 2\n")
    workspace = work / "workspace.yaml"
    workspace.write_text(f"load_from:\n  - python_module:\n      module_name: snapshot_assets.definitions\n"
                         f"      location_name: snapshotter\n      working_directory: {REPO}\n")
    config = work / "snapshotter.conf"
    config.write_text(f"""snapshotter {{
      buffer {{ path = {json.dumps(str(work / 'buffer'))}, seal_interval = 500ms }}
      tables = [ {{
        source {{ type = generator, schema = public, table = users, generator {{ seed = 5, rows = 300, rate = 20 }} }}
        key_fields = [id]
        diff.interval = 1h
        destinations = [ {{ type = local, path = {json.dumps(str(work / 'archive'))} }} ]
        formats {{ snapshot = [jsonl], diff = [jsonl] }}
      }} ]
    }}""")
    return home, workspace, config


def start_daemon(work: Path, workspace: Path, env: dict[str, str]) -> Service:
    log = work / "dagster-daemon.log"
    with log.open("wb") as out:
        process = subprocess.Popen([str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", str(workspace)],
                                   cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return Service("dagster-daemon", process, log)


def succeeded(instance: dg.DagsterInstance, run_id: str, log: Path) -> None:
    status = poll(lambda: ended_status(run_status(instance, run_id)), RUN_DEADLINE_S, f"end of run {run_id}", log,
                  interval_s=2.0)
    assert status == dg.DagsterRunStatus.SUCCESS, f"run {run_id} ended {status}"


def rebuilt_equals_source(table: TableConfig, position: str) -> None:
    pipe = TablePipeline(table)
    reader = ArchiveReader(pipe.destinations[0], table.key_prefix, key_fields=("id",), cmp=compare_lsn)
    rebuilt = reader.reconstruct_as_of(position)
    assert rebuilt is not None and rebuilt.position == position
    source = build_subscriber(table)
    assert isinstance(source, GeneratorSubscriber)
    assert equals_model(rebuilt.rows, source.table_at(position))


