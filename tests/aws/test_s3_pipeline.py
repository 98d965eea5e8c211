"""The whole pipeline on S3 (moto_server): `snapshotter run --once` four times, re-basing in between.

Two tables in one code location: `public.users` archives to ONE S3 destination only (signed as an
assumed role, events to SQS), `public.orders` to a local directory AND S3. Each run ingests more of
the generator's stream and materializes the trigger's decisions through the Dagster assets (Spark
builds, the manifest commits, the archive_is_sound check runs): snapshot, diff, re-base (churn over
the policy's threshold: the snapshot is built from the local STATE dataset even though no
destination is local), diff. Then, from S3 alone: the reader CLI rebuilds every table at every
artifact boundary in every format and it equals the generator's model of the table there;
`verify --deep` passes; every check execution passed; objects above the (test-sized) multipart
threshold were uploaded as multipart; the SQS queue got one event per artifact.
"""

from __future__ import annotations

import io
import json
import urllib.parse
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from snapshot_assets.cli import main
from tests.aws.pipeline_support import FORMATS, Location, Product, equals_model, model
from tests.aws.support import bucket, client

pytestmark = [pytest.mark.slow, pytest.mark.s3]

RUNS = ((300, ["snapshot"]), (500, ["diff"]), (900, ["snapshot"]), (1100, ["diff"]))  # generator changes, wrote
CHURN = 400  # run 3 brings the churn since the snapshot to 600


@pytest.fixture(scope="module")
def product(moto_server: str, spark_work: Path,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[Product, dict[str, Any]]:
    work = tmp_path_factory.mktemp("s3-pipeline")
    users, orders = bucket(moto_server), bucket(moto_server)
    queue = client("sqs", moto_server).create_queue(QueueName="s3-pipeline-events")["QueueUrl"]
    s3 = {"endpoint_url": moto_server, "path_style": True, "region": "us-east-1", "credentials": "archive"}
    users_dest = {"type": "s3", "bucket": users, "prefix": "only-s3/", "multipart_threshold": 1024, **s3}
    orders_dests = [{"type": "local", "path": str(work / "local-archive")},
                    {"type": "s3", "bucket": orders, "prefix": "mixed/", **s3}]
    events = {"type": "sqs", "queue_url": queue, "endpoint_url": moto_server, "region": "us-east-1",
              "credentials": "events"}
    policy = f"snapshot {{ max_churn_records = {CHURN} }}, {FORMATS}"
    tables = {"public.users": f"destinations = [{json.dumps(users_dest)}], events = [{json.dumps(events)}], {policy}",
              "public.orders": f"destinations = {json.dumps(orders_dests)}, {policy}"}
    credentials = (f'archive {{ type = assume_role, role_arn = "arn:aws:iam::123456789012:role/archive-writer", '
                   f'endpoint_url = "{moto_server}", region = us-east-1 }}, '
                   'events { type = ambient, region = us-east-1 }')
    prod = Product(work, moto_server, tables, credentials, cwd=spark_work)
    for changes, wrote in RUNS:
        done = prod.run_once(changes)
        assert done.returncode == 0, done.stderr[-3000:]
        for table in tables:
            line = next(ln for ln in done.stdout.splitlines() if ln.startswith(table + ":"))
            assert [w.split("@")[0] for w in line.split("wrote ")[1].split(", ")] == wrote, line
    return prod, {"users": Location("public.users", users, "only-s3/", "users/"),
                  "orders": Location("public.orders", orders, "mixed/", "orders/"), "queue": queue}


def _cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(args), out=out), out.getvalue()


def _manifest(prod: Product, loc: Location) -> dict[str, Any]:
    body = client("s3", prod.endpoint).get_object(Bucket=loc.bucket, Key=f"{loc.prefix}{loc.key_prefix}manifest.json")
    doc: dict[str, Any] = json.loads(body["Body"].read())
    return doc


@pytest.mark.parametrize("name", ["users", "orders"], ids=["s3-only", "local-and-s3"])
def test_the_archive_on_s3_rebuilds_the_source_at_every_boundary(product: tuple[Product, dict[str, Any]],
                                                                 name: str) -> None:
    prod, env = product
    loc: Location = env[name]
    m = _manifest(prod, loc)
    assert [(a["kind"], a["epoch"]) for a in m["artifacts"]] == [("snapshot", 1), ("diff", 1), ("snapshot", 2),
                                                                 ("diff", 2)]
    oracle = model(loc.table, RUNS[-1][0])
    for art in m["artifacts"]:
        at = art["to_position"]
        for fid in ("jsonl", "protobuf", "parquet"):
            if art["kind"] == "diff" and fid == "protobuf":
                continue  # diffs are written as jsonl and parquet only
            code, out = _cli("reconstruct", *loc.flags(prod.endpoint), "--at", at, "--format", fid, "--output", "json")
            assert code == 0
            doc = json.loads(out)
            assert doc["position"] == at and equals_model(doc["rows"], oracle.table_at(at)), (fid, at)
    code, out = _cli("verify", *loc.flags(prod.endpoint), "--deep")
    assert code == 0 and out.startswith("ok:"), out


def _opens(prod: Product, uri: str) -> int:
    """Open the object (or every part of the parquet folder) a manifest URI names; its total size."""
    if uri.startswith("file://"):
        path = Path(urllib.parse.unquote(uri.removeprefix("file://")))
        files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
        return sum(len(f.read_bytes()) for f in files)
    assert uri.startswith("s3://"), uri
    bucket_name, key = uri.removeprefix("s3://").split("/", 1)
    s3 = client("s3", prod.endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket_name, Prefix=key + "/").get("Contents", [])] or [key]
    return sum(len(s3.get_object(Bucket=bucket_name, Key=k)["Body"].read()) for k in keys)


def test_each_copy_of_the_manifest_names_its_own_objects(product: tuple[Product, dict[str, Any]]) -> None:
    prod, env = product
    loc: Location = env["orders"]
    root = prod.work / "local-archive"
    local = json.loads((root / "orders" / "manifest.json").read_text())
    remote = _manifest(prod, loc)
    for doc, own in ((local, f"file://{root}/orders/"), (remote, f"s3://{loc.bucket}/{loc.prefix}orders/")):
        uris = [ref["uri"] for art in doc["artifacts"] for ref in art["formats"].values()]
        assert len(uris) == 4 * 3 - 2 and all(u.startswith(own) for u in uris), uris
        sizes = [ref["size_bytes"] for art in doc["artifacts"] for ref in art["formats"].values()]
        assert [_opens(prod, u) for u in uris] == sizes
    for doc in (local, remote):  # apart from where the objects are, the copies are the same manifest
        for art in doc["artifacts"]:
            for ref in art["formats"].values():
                ref["uri"] = ref["uri"].rsplit("/orders/", 1)[1]
    assert local == remote


def test_every_archive_check_passed_and_the_manifest_carries_the_metrics(
        product: tuple[Product, dict[str, Any]]) -> None:
    prod, _ = product
    instance = dg.DagsterInstance.from_config(str(prod.work / "dagster"))
    key = dg.AssetCheckKey(dg.AssetKey("manifest"), "archive_is_sound")
    history = instance.event_log_storage.get_asset_check_execution_history(key, limit=50)
    assert len(history) == 2 * len(RUNS)  # one per artifact run of each table
    assert {r.status.value for r in history} == {"SUCCEEDED"}
    assert all(r.event and r.event.asset_check_evaluation and r.event.asset_check_evaluation.passed for r in history)
    event = instance.get_latest_materialization_event(dg.AssetKey("manifest"))  # the last run: orders' diff
    assert event is not None and event.asset_materialization is not None
    meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    assert meta["snapshotter_epoch"] == 2 and meta["snapshotter_artifacts_written_total{kind=diff}"] == 2
    assert meta["snapshotter_buffer_depth"] == 0 and meta["snapshotter_outbox_depth"] == 0


def test_large_objects_went_up_as_multipart(product: tuple[Product, dict[str, Any]]) -> None:
    prod, env = product
    loc: Location = env["users"]
    s3 = client("s3", prod.endpoint)
    objects = s3.list_objects_v2(Bucket=loc.bucket, Prefix=loc.prefix)["Contents"]
    large = [o for o in objects if o["Size"] > 1024 and not o["Key"].endswith("manifest.json")]
    assert large and all(o["ETag"].strip('"').endswith("-1") for o in large)  # S3's multipart ETag: md5-<parts>


def test_one_event_per_artifact_and_counters_agree(product: tuple[Product, dict[str, Any]]) -> None:
    prod, env = product
    sqs = client("sqs", prod.endpoint)
    ids: list[str] = []
    while messages := sqs.receive_message(QueueUrl=env["queue"], MaxNumberOfMessages=10).get("Messages", []):
        ids += [json.loads(m["Body"])["id"] for m in messages]
    m = _manifest(prod, env["users"])
    assert sorted(ids) == sorted(f"public.users:{a['kind']}:{a['to_position']}" for a in m["artifacts"])
    code, out = _cli("status", "--config", str(prod.config_file), "--output", "json")
    assert code == 0
    users = next(t for t in json.loads(out)["tables"] if t["table"] == "public.users")
    assert users["epoch"] == 2 and users["outbox_depth"] == 0 and users["decision"] == "none"
    assert users["counters"]["artifacts_written_total"] == {"snapshot": 2.0, "diff": 2.0}
    assert [d["ok"] for d in users["destinations"]] == [True]
