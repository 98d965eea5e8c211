"""The code location's resources at work: job runs in process with the registered resources.

One generator table archived to ONE S3 destination on moto_server whose spec names neither an
endpoint nor a region: they come from the registered `s3` resource (dagster-aws's S3Resource),
configured at launch through `run_config`, so an object on moto proves the run used it. Spark is
the registered PySparkResource (`spark.master = local[2]`), the ingest run reads the `subscribers`
resource into the `change_buffers` resource, events go to a file sink (`event_sinks`).

The built artifact travels from the snapshot/diff asset to the manifest asset through Dagster (the
artifact IO manager, in the instance's event log), never through a file beside the buffer; it can
be loaded from another process given only the producing run. A run whose manifest write lands but
reports failure (an ambiguous write, injected by wrapping the real S3 destination) fails without
an event; the next artifact run finds that leftover in the instance, settles it (its event is
sent once) and records that, so no later run settles it again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import dagster as dg
import pytest

from resources.aws_credentials import CredentialProfiles
from resources.destinations.base import Destination, DestinationError, GetResult, ObjectInfo, PutResult
from resources.destinations.multipart import MultipartUpload
from resources.destinations_resource import DestinationsResource
from resources.subscribers.generator import GeneratorSubscriber
from snapshot_assets import tables
from snapshot_assets.archive.manifest import load_artifact
from snapshot_assets.assets import BUILT, MANIFEST, change_buffer, diff, manifest, snapshot
from snapshot_assets.config import TableConfig
from snapshot_assets.definitions import resources
from snapshot_assets.handoff import ARTIFACT, ArtifactIOManager, unsettled
from snapshot_assets.jobs import diff_job, ingest_job, snapshot_job
from snapshot_assets.tables import FROM_TAG, INGEST_TABLE_TAG, TO_TAG, TRIGGER_TAG
from tests.aws.support import bucket, client
from tests.dagster_instances import checked_instance

pytestmark = [pytest.mark.slow, pytest.mark.s3]

TABLE = "public.users"  # a partition of the code location whatever config it was imported with
PREFIX = "users/"


@dataclass
class Location:
    work: Path
    endpoint: str
    bucket: str
    instance: dg.DagsterInstance

    @property
    def events(self) -> list[str]:
        path = self.work / "events.jsonl"
        return [json.loads(line)["id"] for line in path.read_text().splitlines()] if path.exists() else []

    def write_config(self, changes: int) -> None:
        dest = {"type": "s3", "bucket": self.bucket, "prefix": "res/"}  # endpoint and region: the s3 resource's
        generator = json.dumps({"seed": 9, "rows": 60, "changes": changes})
        (self.work / "snapshotter.conf").write_text(f"""snapshotter {{
          source {{ type = generator, table = users, generator {generator} }}
          destinations = [ {json.dumps(dest)} ]
          events = [ {{ type = file, path = "{self.work / 'events.jsonl'}" }} ]
          formats {{ snapshot = [jsonl, parquet], diff = [jsonl] }}
          buffer {{ path = "{self.work / 'buffer'}", seal_interval = 100ms }}
          spark {{ master = "local[2]", conf {{ spark.sql.shuffle.partitions = "2" }} }}
        }}""")
        tables.config.cache_clear()
        tables.pipeline.cache_clear()

    def run_config(self) -> dict[str, Any]:
        return {"resources": {"s3": {"config": {"endpoint_url": self.endpoint, "region_name": "us-east-1",
                                                "path_style": True}}}}

    def manifest(self) -> dict[str, Any]:
        body = client("s3", self.endpoint).get_object(Bucket=self.bucket, Key=f"res/{PREFIX}manifest.json")["Body"]
        doc: dict[str, Any] = json.loads(body.read())
        return doc


@pytest.fixture
def location(tmp_path: Path, moto_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Location]:
    monkeypatch.setenv("SNAPSHOTTER_CONFIG", str(tmp_path / "snapshotter.conf"))
    with checked_instance() as instance:
        loc = Location(tmp_path, moto_server, bucket(moto_server), instance)
        loc.write_config(20)  # before any resource is built: the Spark resource comes from the config
        try:
            yield loc
        finally:
            tables.config.cache_clear()
            tables.pipeline.cache_clear()


def _defs(**override: object) -> dg.Definitions:
    """The code location's assets and jobs on its registered resources (built for the active config)."""
    return dg.Definitions(assets=[change_buffer, snapshot, diff, manifest], jobs=[snapshot_job, diff_job, ingest_job],
                          resources={**resources(), **override})


def _ingest(loc: Location, changes: int) -> None:
    """The ingest run of the generator's first `changes` changes (a longer stream extends a shorter one)."""
    loc.write_config(changes)
    result = _defs().resolve_job_def("ingest_job").execute_in_process(
        tags={INGEST_TABLE_TAG: TABLE}, instance=loc.instance, run_config=loc.run_config())
    assert result.success
    expected = GeneratorSubscriber(TABLE, seed=9, rows=60, changes=changes).end_position()
    assert tables.pipeline(TABLE).buffer().durable_position() == expected


def _run(loc: Location, defs: dg.Definitions, job: str, *, ok: bool = True,
         tags: dict[str, str] | None = None) -> dg.ExecuteInProcessResult:
    result = defs.resolve_job_def(job).execute_in_process(partition_key=TABLE, instance=loc.instance, tags=tags,
                                                          run_config=loc.run_config(), raise_on_error=False)
    assert result.success is ok, result.all_events[-1]
    return result


def _built(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    (mat,) = [m for m in result.asset_materializations_for_node(asset)]
    return {k: v.value for k, v in mat.metadata.items()}


class _ManifestLandsThenFails:
    """A real destination whose manifest writes land and then report a lost connection (outcome unknown)."""

    def __init__(self, inner: Destination) -> None:
        self.inner = inner
        self.name = inner.name

    def put_if(self, key: str, data: bytes, expected_revision: str | None) -> str:
        landed = self.inner.put_if(key, data, expected_revision)
        raise DestinationError(f"{self.name}: manifest write {key}: connection lost, outcome unknown (landed {landed})")

    def put(self, key: str, stream: BinaryIO | bytes) -> PutResult:
        return self.inner.put(key, stream)

    def get(self, key: str) -> GetResult | None:
        return self.inner.get(key)

    def open_read(self, key: str) -> BinaryIO:
        return self.inner.open_read(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def uri(self, key: str) -> str:
        return self.inner.uri(key)

    def begin_multipart(self, key: str) -> MultipartUpload:
        return self.inner.begin_multipart(key)

    def abort_stale_uploads(self, prefix: str, older_than_s: float) -> tuple[str, ...]:
        return self.inner.abort_stale_uploads(prefix, older_than_s)


class _ManifestRefused(_ManifestLandsThenFails):
    """A real destination whose manifest writes fail before anything is sent."""

    def put_if(self, key: str, data: bytes, expected_revision: str | None) -> str:
        raise DestinationError(f"{self.name}: manifest write {key}: endpoint unreachable")


class _AmbiguousManifestWrites(DestinationsResource):
    def for_table(self, table: TableConfig, profiles: CredentialProfiles) -> list[Destination]:
        return [_ManifestLandsThenFails(d) for d in super().for_table(table, profiles)]


class _RefusedManifestWrites(DestinationsResource):
    def for_table(self, table: TableConfig, profiles: CredentialProfiles) -> list[Destination]:
        return [_ManifestRefused(d) for d in super().for_table(table, profiles)]


def snapshot_job_of_the_code_location() -> dg.JobDefinition:
    """The snapshot job on the registered resources, loadable by reference (what re-execution needs)."""
    return _defs().resolve_job_def("snapshot_job")


def test_runs_use_the_registered_resources_and_hand_the_artifact_over_through_dagster(location: Location) -> None:
    loc = location
    _ingest(loc, 20)
    first = _run(loc, _defs(), "snapshot_job")
    built = _built(first, "snapshot")
    assert built["spark_mode"] == "classic"  # the PySparkResource's session (spark.master = local[2])
    assert "build_before_images" not in built  # a diff build's fact
    committed = loc.manifest()["artifacts"]
    assert [a["kind"] for a in committed] == ["snapshot"]
    assert built[ARTIFACT] == committed[0]  # what the manifest asset committed is what the snapshot asset built
    assert all(ref["uri"].startswith(f"s3://{loc.bucket}/res/") for ref in committed[0]["formats"].values())
    loaded = [e for e in first.all_events if e.event_type_value == "LOADED_INPUT" and e.step_key == "manifest"]
    assert {e.event_specific_data.manager_key for e in loaded} == {"artifact_io_manager"}  # type: ignore[union-attr]
    assert not (loc.work / "buffer" / "_pending").exists()
    assert loc.events == [f"{TABLE}:snapshot:{committed[0]['to_position']}"]

    # Another process (a run worker on another host) loads it from the instance, given the producing run.
    # Both contexts enter ephemeral instances of their own: `with` exits them here, in order (see
    # tests/dagster_instances.py for what one left to the garbage collector did to later tests).
    io = ArtifactIOManager()
    with dg.build_output_context(run_id=first.run_id) as upstream, \
            dg.build_input_context(upstream_output=upstream, asset_key=dg.AssetKey("snapshot"), partition_key=TABLE,
                                   instance=loc.instance) as context:
        assert io.load_input(context) == load_artifact(committed[0])


def test_an_ambiguous_manifest_write_is_settled_once_by_the_next_run(location: Location) -> None:
    loc = location
    _ingest(loc, 20)
    _run(loc, _defs(), "snapshot_job")
    snap = loc.manifest()["artifacts"][0]["to_position"]

    _ingest(loc, 40)
    shared = resources()["s3"]
    flaky = _defs(s3=shared, destinations=_AmbiguousManifestWrites(s3=shared))
    failed = _run(loc, flaky, "diff_job", ok=False)
    landed = loc.manifest()["artifacts"]
    assert [a["kind"] for a in landed] == ["snapshot", "diff"]  # the write landed although the run failed
    assert _built(failed, "diff")[ARTIFACT] == landed[1]
    assert loc.events == [f"{TABLE}:snapshot:{snap}"]  # not announced: the run could not know it committed
    left = unsettled(loc.instance, TABLE, BUILT, MANIFEST)
    assert left is not None and left.to_position == landed[1]["to_position"]

    _ingest(loc, 60)
    settling = _run(loc, _defs(), "diff_job")
    final = loc.manifest()["artifacts"]
    assert [a["kind"] for a in final] == ["snapshot", "diff", "diff"] and final[:2] == landed
    assert loc.events == [f"{TABLE}:snapshot:{snap}", f"{TABLE}:diff:{landed[1]['to_position']}",
                          f"{TABLE}:diff:{final[2]['to_position']}"]
    observed = [e for e in settling.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert len(observed) == 1 and observed[0].asset_key == MANIFEST
    assert unsettled(loc.instance, TABLE, BUILT, MANIFEST) is None


def test_a_run_that_failed_at_its_manifest_is_re_executed_from_failure(location: Location) -> None:
    """Only the manifest step runs again, in another run: it commits the artifact the failed run built."""
    loc = location
    _ingest(loc, 20)
    shared = resources()["s3"]
    failed = _run(loc, _defs(s3=shared, destinations=_RefusedManifestWrites(s3=shared)), "snapshot_job", ok=False)
    built = _built(failed, "snapshot")[ARTIFACT]
    with pytest.raises(Exception, match="NoSuchKey"):
        loc.manifest()

    options = dg.ReexecutionOptions.from_failure(failed.run_id, loc.instance)
    job = dg.reconstructable(snapshot_job_of_the_code_location)
    with dg.execute_job(job, loc.instance, run_config=loc.run_config(), reexecution_options=options,
                        tags={"dagster/partition": TABLE}) as again:
        assert again.success
        steps = {e.step_key for e in again.all_events if e.event_type_value == "STEP_START"}
        assert steps == {"manifest"}
    assert loc.manifest()["artifacts"] == [built]
    assert loc.events == [f"{TABLE}:snapshot:{built['to_position']}"]


def test_a_sensor_request_overtaken_by_a_forced_snapshot_builds_only_what_is_left(location: Location) -> None:
    """The sensor fixed a diff's boundary; a forced snapshot (UI, GraphQL) ran first and moved the head.

    Covered, the request builds nothing and the run succeeds with its manifest step skipped; partly
    covered, the diff starts at the new head and keeps its end, so the chain stays contiguous."""
    loc = location
    _ingest(loc, 20)
    _run(loc, _defs(), "snapshot_job")
    first = loc.manifest()["head_position"]
    _ingest(loc, 40)
    durable = tables.pipeline(TABLE).buffer().durable_position()
    assert durable is not None and durable != first
    requested = {FROM_TAG: first, TO_TAG: durable, TRIGGER_TAG: "diff_interval"}  # what the sensor put in its tags
    _run(loc, _defs(), "snapshot_job")  # the forced snapshot, decided when it runs: up to the durable position
    before = loc.manifest()
    assert before["head_position"] == durable

    covered = _run(loc, _defs(), "diff_job", tags=requested)
    assert not covered.asset_materializations_for_node("diff")
    skipped = {e.step_key for e in covered.all_events if e.event_type_value == "STEP_SKIPPED"}
    assert skipped == {"manifest"}
    assert loc.manifest() == before

    _ingest(loc, 60)
    later = tables.pipeline(TABLE).buffer().durable_position()
    assert later is not None
    partly = _run(loc, _defs(), "diff_job", tags={**requested, TO_TAG: later})
    built = _built(partly, "diff")
    assert (built["from_position"], built["to_position"]) == (durable, later)
    assert built["build_before_images"] is True  # the generator's changes update and delete rows
    chain = loc.manifest()["artifacts"]
    assert [(a["kind"], a.get("from_position"), a["to_position"]) for a in chain[1:]] == [
        ("snapshot", None, durable), ("diff", durable, later)]
