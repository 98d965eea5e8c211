"""Shared fixtures: an S3 endpoint (moto_server over HTTP on loopback) and fresh buckets in it.

Real HTTP end to end: the code under test talks to moto_server with ordinary boto3 clients, the
same way it talks to AWS or MinIO. No in-process mocking.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from hypothesis import settings

# Property tests assert outcomes, not speed: no per-example deadline (on a loaded 2-core machine, with
# two workers and their Spark and PostgreSQL processes, a first example can take seconds).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# Every JVM the tests start (local Spark sessions, Spark Connect servers, a standalone cluster's
# master and workers) compiles with C1 only. The tests' data is tiny, so HotSpot's optimising C2
# compiler never pays for itself: it took a quarter to a third of the Spark tests' CPU (README, Tests),
# and the suite is CPU-bound on two cores. Without tiers the JVM reserves only 48 MB for compiled code,
# which a long-lived session fills with Spark's generated classes within minutes ("CodeCache is full.
# Compiler has been disabled."): from then on every new query ran in the bytecode interpreter. The
# reservation is therefore the tiered default's. They also collect with the serial collector: on
# tiny heaps G1's concurrent and parallel GC threads cost more than they save, and the serial one took
# the JVM CPU of tests/spark/test_cluster_build.py's local-runtime chain (8 builds) from 76-78 s to
# 68-73 s. Set here, before any fixture starts a process, so every child inherits it.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC")

_AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never read the developer's ~/.aws: a profile or endpoint there must not leak into tests.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
_AWS_UNSET = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION")
_STARTUP_TIMEOUT_S = 30.0


@pytest.fixture(scope="session", autouse=True)
def aws_test_credentials() -> Iterator[None]:
    """Dummy AWS credentials for the whole session, so no test can ever reach a real account."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _AWS_TEST_ENV.items():
            mp.setenv(name, value)
        for name in _AWS_UNSET:
            mp.delenv(name, raising=False)
        yield


@pytest.fixture(autouse=True)
def no_connect_mode_left_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with pyspark's connect mode off and leaves it off: a test that opens a
    Connect session and stops it with pyspark's own `stop()` (not `SparkRuntime.stop`) leaves the
    switch on, and a later test's classic session in the same worker then fails with
    CONNECT_URL_NOT_SET (tests/spark/test_idle_stop.py before a Dagster run did)."""
    from snapshot_assets.spark.session import CONNECT_MODE

    monkeypatch.delenv(CONNECT_MODE, raising=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _moto_server_command(port: int) -> list[str]:
    script = Path(sys.executable).with_name("moto_server")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "moto.server"]
    return [*launcher, "-H", "127.0.0.1", "-p", str(port)]


def _wait_until_answering(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode} before answering")
        try:
            with urllib.request.urlopen(url + "/moto-api/", timeout=1):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means it is serving
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer on {url} within {_STARTUP_TIMEOUT_S:.0f}s")


@pytest.fixture(scope="session")
def moto_server(aws_test_credentials: None) -> Iterator[str]:
    """The endpoint URL (`http://127.0.0.1:<port>`) of a moto_server subprocess for this session."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        _moto_server_command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_until_answering(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def s3_bucket(moto_server: str) -> str:
    """The name of a new, empty bucket on the moto_server endpoint."""
    name = f"test-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(Bucket=name)
    return name
