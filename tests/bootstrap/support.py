"""The bootstrap tests' pieces: a source table that changes step by step (the oracle), its archive
written by the real commit path (TablePipeline.commit: retention, pins, grace, orphan collection)
with artifacts from the Python writer (Spark writes the same format, slower), the HTTP service
serving it, and a replica that knows nothing but plain HTTP GETs."""

from __future__ import annotations

import copy
import io
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.fold import FoldState, fold_diff
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.manifest import Artifact, Manifest
from snapshot_assets.archive.pins import snapshot_pin, with_pin
from snapshot_assets.archive.positions import format_lsn
from snapshot_assets.archive.writer import ArtifactWriter
from snapshot_assets.bootstrap import Bootstrapper
from snapshot_assets.config import parse_config
from snapshot_assets.http_api import serve
from snapshot_assets.launch import SubmitRun
from snapshot_assets.pipeline.table import CommitReport, TablePipeline

TABLE = "public.users"
Rows = dict[int, dict[str, Any]]


def table_config(tmp: Path, destination: dict[str, Any], *, keep_epochs: int = 0, grace: str = "1h") -> Any:
    text = f"""snapshotter {{
      source {{ type = generator, table = users }}
      destinations = [ {json.dumps(destination)} ]
      formats {{ snapshot = [jsonl, protobuf], diff = [jsonl, protobuf] }}
      retention {{ keep_epochs = {keep_epochs}, grace = {grace} }}
      buffer.path = "{tmp / 'buffer'}"
    }}"""
    return parse_config(text, env={}).tables[0]


@dataclass
class SourceArchive:
    """A source table and its archive; every commit goes through the pipeline's real commit."""

    pipe: TablePipeline
    rows: Rows = field(default_factory=dict)
    at: dict[str, Rows] = field(default_factory=dict)  # the source as of each committed position
    step: int = 0

    @property
    def head(self) -> str:
        return format_lsn(self.step * 0x10)

    def _writer(self) -> ArtifactWriter:
        return ArtifactWriter(self.pipe.destinations, self.pipe.cfg.key_prefix,
                              snapshot_formats=self.pipe.cfg.snapshot_formats, diff_formats=self.pipe.cfg.diff_formats)

    def _advance(self, n: int = 6) -> list[Change]:
        """`n` changes to the source (inserts, updates, deletes), one position further."""
        self.step += 1
        changes = []
        for i in range(n):
            ident = (self.step * 7 + i * 3) % 23 + 1
            new = {"id": ident, "name": f"user {ident} v{self.step}", "score": self.step * 1.5,
                   "big": 2**60 + self.step, "active": i % 2 == 0, "note": None}
            old = self.rows.get(ident)
            if old is not None and i % 3 == 2:
                changes.append(Change(Action.DELETE, str(ident), old, None))
                del self.rows[ident]
            elif old is not None:
                changes.append(Change(Action.UPDATE, str(ident), old, new))
                self.rows[ident] = new
            else:
                changes.append(Change(Action.INSERT, str(ident), None, new))
                self.rows[ident] = new
        return changes

    def snapshot(self, label: str = "") -> CommitReport:
        """A snapshot at a new position (the changes since the head folded in), pinned as the build
        pins it (TablePipeline._build): the user's label, `initial` for the table's first."""
        previous = self.pipe.manifest()
        self._advance()
        art = self._writer().write_snapshot(previous.epoch + 1, self.head, list(self.rows.values()))
        return self._commit(with_pin(art, snapshot_pin(previous, label, art.created_at)))

    def diff(self) -> CommitReport:
        m = self.pipe.manifest()
        start = m.head_position
        changes = self._advance()
        return self._commit(self._writer().write_diff(m.epoch, start, self.head, changes))

    def _commit(self, art: Artifact) -> CommitReport:
        self.at[art.to_position] = copy.deepcopy(self.rows)
        return self.pipe.commit(art)

    def manifest(self) -> Manifest:
        return self.pipe.manifest()


@contextmanager
def http_service(pipes: list[TablePipeline], submit: SubmitRun | None = None) -> Iterator[str]:
    """`snapshotter serve`'s HTTP API (the real server) on a free port; its base URL."""
    stop, bound = threading.Event(), threading.Event()
    port: list[int] = []

    def listening(p: int) -> None:
        port.append(p)
        bound.set()

    thread = threading.Thread(target=serve, kwargs={
        "collect": list, "tables": [p.name for p in pipes], "port": 0, "addr": "127.0.0.1", "stop": stop,
        "on_listening": listening, "bootstrap": Bootstrapper(pipes), "submit": submit}, daemon=True)
    thread.start()
    try:
        assert bound.wait(30), "the HTTP service did not start listening within 30 s"
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        stop.set()
        thread.join(30)


def get_json(url: str, method: str = "GET") -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def download(url: str) -> bytes:
    """One plain GET: no credentials, no AWS library (a presigned URL carries its own signature)."""
    with urllib.request.urlopen(url, timeout=30) as response:
        data: bytes = response.read()
    return data


@dataclass
class Replica:
    """A consumer that only speaks HTTP: asks the service, GETs the URLs, folds what it got."""

    service: str
    table: str = TABLE
    fmt: str = "jsonl"
    state: FoldState | None = None
    position: str | None = None

    def ask(self, expires: str = "") -> dict[str, Any]:
        query = {k: v for k, v in (("position", self.position), ("expires", expires)) if v}
        url = f"{self.service}/bootstrap/{urllib.parse.quote(self.table)}"
        status, body = get_json(url + ("?" + urllib.parse.urlencode(query) if query else ""))
        assert status == 200, body
        return body

    def apply(self, answer: dict[str, Any]) -> None:
        fmt = FORMATS[self.fmt]
        for art in answer["artifacts"]:
            data = io.BytesIO(download(art["formats"][self.fmt]["url"]))
            if art["kind"] == "snapshot":
                self.state = FoldState(("id",))
                for row in fmt.read_snapshot(data):
                    self.state.put(row)
            else:
                assert self.state is not None, "a diff-only answer for a replica without state"
                fold_diff(self.state, fmt.read_diff(data))
            self.position = art["to_position"]
        assert self.position == answer["head_position"]

    def sync(self) -> dict[str, Any]:
        answer = self.ask()
        self.apply(answer)
        return answer

    def rows(self) -> Rows:
        assert self.state is not None
        return {row["id"]: row for row in self.state.rows()}
