"""Bootstrap by position over `snapshotter serve`: a replica that only makes plain HTTP GETs (urllib,
no AWS library, no credentials) rebuilds the table equal to the source, fresh and resuming
mid-chain, also across a re-base between its two requests; on S3 (moto_server: presigned URLs) and
on a local destination (file:// URLs)."""

from __future__ import annotations

import datetime as _dt
import urllib.error
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from snapshot_assets.archive.retention import retired_of
from snapshot_assets.pipeline.table import TablePipeline
from tests.aws.support import bucket
from tests.bootstrap.support import Replica, SourceArchive, download, http_service, table_config


def _destination(kind: str, tmp: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    if kind == "local":
        return {"type": "local", "path": str(tmp / "archive")}
    endpoint = request.getfixturevalue("moto_server")
    return {"type": "s3", "bucket": bucket(endpoint), "prefix": "arc/", "endpoint_url": endpoint,
            "path_style": True, "region": "us-east-1"}


@pytest.fixture(params=["s3", "local"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _archive(kind: str, tmp: Path, request: pytest.FixtureRequest, **retention: Any) -> SourceArchive:
    return SourceArchive(TablePipeline(table_config(tmp, _destination(kind, tmp, request), **retention)))


@pytest.fixture
def archive(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SourceArchive]:
    yield _archive(kind, tmp_path, request, keep_epochs=1, grace="1h")


def _expect_urls(kind: str, answer: dict[str, Any]) -> None:
    for art in answer["artifacts"]:
        for ref in art["formats"].values():
            url = urllib.parse.urlsplit(ref["url"])
            if kind == "s3":
                assert url.scheme == "http" and "X-Amz-Signature" in url.query and "X-Amz-Expires=600" in url.query
            else:
                assert url.scheme == "file"


def test_fresh_replica_then_resume_mid_chain(archive: SourceArchive, kind: str) -> None:
    archive.snapshot()
    archive.diff()
    archive.diff()
    with http_service([archive.pipe]) as service:
        fresh = Replica(service)
        first = fresh.ask(expires="10m")
        _expect_urls(kind, first)
        assert first["mode"] == "snapshot" and first["head_position"] == archive.head
        assert [a["kind"] for a in first["artifacts"]] == ["snapshot", "diff", "diff"]
        assert first["artifacts"][0]["label"] == "initial"  # the table's first snapshot is pinned
        moment = _dt.datetime.fromisoformat(first["expires_at"])
        assert abs((moment - _dt.datetime.now(_dt.UTC)).total_seconds() - 600) < 60
        fresh.apply(first)
        assert fresh.rows() == archive.rows

        # A replica whose URLs expired after it applied two of the three artifacts re-asks from there.
        at_mid = Replica(service)
        at_mid.apply({"artifacts": first["artifacts"][:2], "head_position": first["artifacts"][1]["to_position"]})
        assert at_mid.rows() == archive.at[at_mid.position or ""]

        archive.diff()
        archive.diff()
        resumed = at_mid.ask()
        assert resumed["mode"] == "diffs" and [a["kind"] for a in resumed["artifacts"]] == ["diff"] * 3
        assert resumed["artifacts"][0]["from_position"] == first["artifacts"][1]["to_position"]
        at_mid.apply(resumed)
        assert at_mid.rows() == archive.rows

        again = fresh.sync()  # the first replica continues from the position it applied
        assert again["mode"] == "diffs" and len(again["artifacts"]) == 2
        assert fresh.rows() == archive.rows
        current = fresh.ask()  # at the head: nothing to download
        assert current["mode"] == "diffs" and current["artifacts"] == [] and current["head_position"] == archive.head


def test_a_rebase_between_two_requests(archive: SourceArchive, kind: str) -> None:
    """The URLs of the first answer still work after a re-base pruned their artifacts (retention.grace),
    and the second request, from a position the archive can no longer serve incrementally, gets the
    new snapshot and the diffs after it."""
    archive.snapshot()
    archive.diff()
    archive.snapshot()  # epoch 2
    archive.diff()
    with http_service([archive.pipe]) as service:
        replica, resuming = Replica(service), Replica(service)
        resuming.sync()  # at the head of epoch 2
        first = replica.ask()
        assert [(a["kind"], a["epoch"]) for a in first["artifacts"]] == [("snapshot", 2), ("diff", 2)]
        before_resume = resuming.position

        archive.snapshot()  # re-base: epoch 3; keep_epochs = 1 prunes epoch 2 (the first snapshot is pinned)
        archive.diff()
        m = archive.manifest()
        assert [(a.kind, a.epoch) for a in m.artifacts] == [("snapshot", 1), ("snapshot", 3), ("diff", 3)]
        assert {(r.artifact.kind, r.artifact.epoch) for r in retired_of(m)} >= {("snapshot", 2), ("diff", 2)}

        replica.apply(first)  # downloaded after the re-base: the objects wait out their grace
        assert replica.rows() == archive.at[first["head_position"]]
        second = replica.ask()
        assert second["mode"] == "snapshot"
        assert [(a["kind"], a["epoch"]) for a in second["artifacts"]] == [("snapshot", 3), ("diff", 3)]
        replica.apply(second)
        assert replica.rows() == archive.rows

        assert resuming.position == before_resume
        resumed = resuming.sync()  # its position is in no chain any more: a snapshot again
        assert resumed["mode"] == "snapshot" and resuming.rows() == archive.rows


def test_without_grace_a_handed_out_url_dies_with_the_rebase(kind: str, tmp_path: Path,
                                                             request: pytest.FixtureRequest) -> None:
    """The contrast that shows what the grace buys: with `retention.grace = 0` the re-base deletes the
    objects a consumer was just handed."""
    archive = _archive(kind, tmp_path, request, keep_epochs=1, grace="0")
    archive.snapshot()
    archive.snapshot()
    archive.diff()
    with http_service([archive.pipe]) as service:
        answer = Replica(service).ask()
        archive.snapshot()
        url = answer["artifacts"][1]["formats"]["jsonl"]["url"]
        with pytest.raises((urllib.error.HTTPError, urllib.error.URLError)):
            download(url)
