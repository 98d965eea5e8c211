"""Which snapshots the real build pins, through the code location's jobs run in process (Spark, the
registered resources): the table's first snapshot (`initial`), a `force_snapshot` run given a label
in its run config (the config `POST /snapshot?label=` and `snapshotter snapshot --label` submit:
launch.force_snapshot_run), and not a policy snapshot; with keep_epochs = 1 the labelled one
survives the re-base after it and is readable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from resources.subscribers.generator import GeneratorSubscriber
from snapshot_assets import tables
from snapshot_assets.archive.keys import typed_key
from snapshot_assets.archive.pins import pin_of, snapshot_labelled
from snapshot_assets.archive.positions import comparator
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.assets import change_buffer, diff, manifest, snapshot
from snapshot_assets.definitions import resources
from snapshot_assets.demo import same_rows
from snapshot_assets.jobs import force_snapshot, ingest_job, snapshot_job
from snapshot_assets.launch import FORCE_SNAPSHOT_JOB, force_snapshot_run
from snapshot_assets.tables import INGEST_TABLE_TAG
from tests.dagster_instances import checked_instance

pytestmark = pytest.mark.slow

TABLE = "public.users"
GENERATOR: dict[str, Any] = {"seed": 13, "rows": 40}


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dg.DagsterInstance]:
    monkeypatch.setenv("SNAPSHOTTER_CONFIG", str(tmp_path / "snapshotter.conf"))
    _configure(tmp_path, 20)
    with checked_instance() as inst:
        try:
            yield inst
        finally:
            tables.config.cache_clear()
            tables.pipeline.cache_clear()


def _configure(work: Path, changes: int) -> None:
    generator = json.dumps({**GENERATOR, "changes": changes})
    (work / "snapshotter.conf").write_text(f"""snapshotter {{
      source {{ type = generator, table = users, generator {generator} }}
      destinations = [ {{ type = local, path = "{work / 'archive'}" }} ]
      formats {{ snapshot = [jsonl], diff = [jsonl] }}
      retention {{ keep_epochs = 1, grace = 0 }}
      buffer {{ path = "{work / 'buffer'}", seal_interval = 100ms }}
      spark {{ master = "local[2]", conf {{ spark.sql.shuffle.partitions = "2" }} }}
    }}""")
    tables.config.cache_clear()
    tables.pipeline.cache_clear()


def _defs() -> dg.Definitions:
    return dg.Definitions(assets=[change_buffer, snapshot, diff, manifest],
                          jobs=[snapshot_job, force_snapshot, ingest_job], resources=resources())


def _ingest(work: Path, instance: dg.DagsterInstance, changes: int) -> None:
    _configure(work, changes)
    result = _defs().resolve_job_def("ingest_job").execute_in_process(tags={INGEST_TABLE_TAG: TABLE},
                                                                        instance=instance)
    assert result.success


def _run(instance: dg.DagsterInstance, job: str, run_config: dict[str, Any] | None = None) -> None:
    result = _defs().resolve_job_def(job).execute_in_process(partition_key=TABLE, instance=instance,
                                                              run_config=run_config or {}, raise_on_error=False)
    assert result.success, result.all_events[-1]


def test_the_first_and_the_labelled_snapshots_are_pinned(tmp_path: Path, instance: dg.DagsterInstance) -> None:
    _ingest(tmp_path, instance, 20)
    _run(instance, "snapshot_job")
    _ingest(tmp_path, instance, 40)
    job, _tags, run_config = force_snapshot_run(TABLE, "before-import")
    assert job == FORCE_SNAPSHOT_JOB
    _run(instance, job, run_config)
    _ingest(tmp_path, instance, 60)
    _run(instance, "snapshot_job")  # a policy snapshot: re-bases past the labelled one

    pipe = tables.pipeline(TABLE)
    m = pipe.manifest()
    assert [(a.epoch, (pin_of(a).label, pin_of(a).origin) if pin_of(a) else None)  # type: ignore[union-attr]
            for a in m.snapshots()] == [(1, ("initial", "initial")), (2, ("before-import", "user")), (3, None)]
    labelled = snapshot_labelled(m, "before-import")
    reader = ArchiveReader(pipe.destinations[0], pipe.cfg.key_prefix, cmp=comparator("lsn"))
    rec = reader.reconstruct_as_of(labelled.to_position, m)
    assert rec is not None and rec.position == labelled.to_position
    source = GeneratorSubscriber(TABLE, **GENERATOR, changes=40)
    expected = source.table_at(labelled.to_position)
    assert same_rows({typed_key(r, ("id",)): r for r in rec.rows}, expected)  # type: ignore[arg-type]


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_tables() -> Iterator[None]:
    """The code location's cached config and pipelines are this test's only while it runs."""
    try:
        yield
    finally:
        tables.config.cache_clear()
        tables.pipeline.cache_clear()


def test_post_snapshot_and_the_cli_submit_the_label_as_run_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   fresh_tables: None) -> None:
    """`snapshotter snapshot --label` and `POST /snapshot?label=` create a queued force_snapshot run in the
    $DAGSTER_HOME instance (no daemon runs it here) carrying the label in its run config."""
    from snapshot_assets import cli
    from snapshot_assets.launch import Launcher, workspace_origin
    from snapshot_assets.pipeline.table import TablePipeline
    from tests.bootstrap.support import get_json, http_service

    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())  # the run queue: runs wait for a daemon
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.chdir(REPO)
    conf, workspace = str(tmp_path / "snapshotter.conf"), str(REPO / "workspace.yaml")
    monkeypatch.setenv("SNAPSHOTTER_CONFIG", conf)  # the CLI sets it too: restored after the test
    _configure(tmp_path, 20)

    assert cli.main(["snapshot", "--config", conf, "--table", "users", "--label", "v1", "--workspace", workspace]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{TABLE}: force_snapshot run ") and out.rstrip().endswith("pinned as 'v1'")
    first = out.split("force_snapshot run ", 1)[1].split()[0]

    with dg.DagsterInstance.get() as inst, Launcher(inst, workspace_origin(Path(workspace))) as launcher:
        with http_service([TablePipeline(tables.config().table(TABLE))],
                          submit=launcher.submit) as service:
            code, body = get_json(f"{service}/snapshot?table={TABLE}&label=v2", method="POST")
        assert code == 200, body
        (second,) = [r["run_id"] for r in body["runs"]]
        for run_id, label in ((first, "v1"), (second, "v2")):
            run = inst.get_run_by_id(run_id)
            assert run is not None and run.job_name == FORCE_SNAPSHOT_JOB
            assert run.run_config == {"ops": {"snapshot": {"config": {"label": label}}}}
            assert run.tags["dagster/partition"] == TABLE
            assert run.status == dg.DagsterRunStatus.QUEUED
