"""AWS test fixtures: dedicated moto_server processes for tests that stop, freeze, record or lock down
their endpoint (the shared session `moto_server` must stay up and open for everyone else).

A `Moto` can be frozen with SIGSTOP and thawed with SIGCONT: the kernel keeps accepting
connections and buffering requests meanwhile, so a client sees exactly an endpoint that stopped
answering, and moto's state survives (a killed moto_server would lose every bucket). It can record
every request (moto's recorder, headers included: the Authorization header names the access key id
that signed it) and enforce IAM (moto's `reset-auth`: policies are evaluated, AccessDenied is real).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _free_port, _moto_server_command, _wait_until_answering


@dataclass
class Moto:
    url: str
    process: subprocess.Popen[bytes]
    recording: Path

    def freeze(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.thaw()
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _post(self, path: str, body: bytes) -> None:
        request = urllib.request.Request(self.url + path, data=body, method="POST",
                                         headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(request, timeout=10):
            pass

    def enforce_iam(self, on: bool = True) -> None:
        """From now on every request is authenticated and authorized against moto's IAM (or not)."""
        self._post("/moto-api/reset-auth", b"0" if on else b"inf")

    def requests(self) -> list[dict[str, Any]]:
        """Every request recorded so far, in the order the endpoint wrote them.

        The recorder appends each request as a JSON document and then a newline, in two writes, from
        the server's request threads: under concurrent requests two documents can meet on one line.
        So the file is read as a stream of documents, not as one document per line."""
        text = self.recording.read_text() if self.recording.exists() else ""
        decoder = json.JSONDecoder()
        out: list[dict[str, Any]] = []
        at = 0
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if at == len(text):
                return out
            document, at = decoder.raw_decode(text, at)
            out.append(document)

    def signers(self) -> list[tuple[str, str]]:
        """(service, access key id) of every signed request recorded so far."""
        return [(signed[1], signed[0]) for signed in map(credential_of, self.requests()) if signed]


def credential_of(request: dict[str, Any]) -> tuple[str, str] | None:
    """(access key id, service) that signed a recorded request, from its SigV4 Authorization
    header's `Credential=<key>/<date>/<region>/<service>/aws4_request`; None when unsigned."""
    auth = request["headers"].get("Authorization", "")
    if "Credential=" not in auth:
        return None
    key_id, _date, _region, service, _ = auth.split("Credential=", 1)[1].split(",")[0].split("/")
    return key_id, service


def start_moto(work: Path, *, record: bool = False) -> Moto:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    recording = work / f"moto-{port}.jsonl"
    env = {**os.environ, "MOTO_RECORDER_FILEPATH": str(recording)}
    if record:
        env["MOTO_ENABLE_RECORDING"] = "true"
    process = subprocess.Popen(_moto_server_command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env, cwd=work)
    moto = Moto(url, process, recording)
    try:
        _wait_until_answering(url, process)
    except BaseException:
        moto.stop()
        raise
    return moto


@pytest.fixture(scope="session")
def spark_work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The working directory of every `snapshotter` process the AWS tests start: they share its local
    Spark Connect server (`.snapshotter/spark-connect`), started once and stopped at the end."""
    from snapshot_assets.spark.connect_server import stop_local_connect_server

    work = tmp_path_factory.mktemp("spark-work")
    try:
        yield work
    finally:
        stop_local_connect_server(work / ".snapshotter" / "spark-connect")


@pytest.fixture
def own_moto(tmp_path: Path, aws_test_credentials: None) -> Iterator[Moto]:
    """A moto_server of this test alone (it may be frozen, locked down with IAM, or stopped)."""
    moto = start_moto(tmp_path, record=True)
    try:
        yield moto
    finally:
        moto.stop()
