"""Helpers of the HTTP API tests: a `snapshotter serve` process and plain HTTP calls to it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")
SNAPSHOTTER = str(Path(sys.executable).with_name("snapshotter"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Answer:
    code: int
    content_type: str
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


def call(port: int, path: str, method: str = "GET", timeout: float = 10.0) -> Answer:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Answer(response.status, response.headers["Content-Type"], response.read().decode())
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.headers["Content-Type"], e.read().decode())


def poll(probe: Callable[[], T | None], timeout_s: float, what: str, log: Path | None = None,
         interval_s: float = 0.5) -> T:
    """`probe()` until it returns something other than None; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    error = ""
    while True:
        try:
            value = probe()
        except (OSError, ValueError, KeyError) as e:  # not answering yet, a half-written file
            value, error = None, f"{type(e).__name__}: {e}"
        if value is not None:
            return value
        if time.monotonic() > deadline:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log and log.exists() else ""
            pytest.fail(f"no {what} within {timeout_s:.0f}s (last error: {error or 'none'})\n{tail}")
        time.sleep(interval_s)


def metric(text: str, name: str, table: str) -> float | None:
    """The value of `snapshotter_<name>{table="<table>"}` in a Prometheus exposition, if present."""
    prefix = f'snapshotter_{name}{{table="{table}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return None


@contextmanager
def serve_process(work: Path, config: Path, env: dict[str, str], *extra: str,
                  interval: float = 0.5) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    """`snapshotter serve` on a free port, answering /health/live; SIGTERM (then SIGKILL) at the end."""
    port = free_port()
    log = work / f"serve-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([SNAPSHOTTER, "serve", "--config", str(config), "--host", "127.0.0.1",
                                    "--port", str(port), "--interval", str(interval), *extra],
                                   cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        poll(lambda: call(port, "/health/live", timeout=2) if process.poll() is None else None, 120,
             "answer of `snapshotter serve` on /health/live", log)
        yield port, process, log
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
