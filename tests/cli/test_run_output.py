"""What `snapshotter run --once` and `snapshotter demo` print, and what they leave behind, as real processes.

One working directory for the module: its local Spark Connect server is started by the first
command, reused by the others (as on a person's machine), and stopped at the end.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshot_assets.progress import PLAIN_EVERY_S
from snapshot_assets.spark.connect_server import server_status, stop_local_connect_server
from tests.e2e.conftest import e2e_env

pytestmark = pytest.mark.slow

SNAPSHOTTER = str(Path(sys.executable).with_name("snapshotter"))
TIMEOUT_S = 900
TABLE = "public.users"
STATUS = re.compile(rf"^{re.escape(TABLE)}  \S.*  \d+s$")  # a status line of a phase that lasts


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("run-output")
    (work / "run.conf").write_text(f"""snapshotter {{
  source {{ type = generator, schema = public, table = users, generator {{ seed = 7, rows = 300, changes = 900 }} }}
  key_fields = [id]
  destinations = [ {{ type = local, path = "{work / 'archive'}" }} ]
  formats {{ snapshot = [jsonl, parquet], diff = [jsonl] }}
  buffer {{ path = "{work / 'buffer'}", seal_interval = 200ms }}
  spark {{ conf {{ "spark.driver.memory" = "1g" }}, local_server_idle_timeout = 10m }}
}}
""")
    try:
        yield work
    finally:
        stop_local_connect_server(work / ".snapshotter" / "spark-connect")


def run(work: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run([SNAPSHOTTER, *args], cwd=work, env=e2e_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done, time.monotonic() - started


def event_log(first_line: str) -> Path:
    assert first_line.startswith("event log: "), first_line
    path = Path(first_line.removeprefix("event log: "))
    assert path.is_file(), path
    return path


def results(lines: list[str], seconds: float) -> list[str]:
    """The lines that are not status lines; status lines are at most one per PLAIN_EVERY_S (+1 per phase)."""
    status = [ln for ln in lines if STATUS.match(ln) and not ln.startswith(f"{TABLE}  ingested")]
    assert len(status) <= seconds / PLAIN_EVERY_S + 3, lines
    return [ln for ln in lines if ln not in status]


def assert_dagster_events(path: Path, *jobs: str) -> None:
    text = path.read_text()
    for job in jobs:
        for event in ("STEP_START", "ASSET_MATERIALIZATION", "STEP_SUCCESS"):
            assert re.search(rf" dagster - {job} [0-9a-f-]+ \S+ {event} - ", text), (job, event)


def test_run_once_prints_a_few_lines_and_logs_dagster_to_a_file(work: Path) -> None:
    done, seconds = run(work, "run", "--once", "--config", str(work / "run.conf"))
    lines = done.stdout.splitlines()
    log = event_log(lines[0])
    assert log.parent == work / ".snapshotter" / "logs" and log.name.startswith("run-once-")
    kept = results(lines[1:], seconds)
    assert len(kept) == 3, lines
    assert re.fullmatch(rf"{TABLE}  ingested [\d,]+ changes in [\d.]+s \([\d,]+/s\), buffer durable at \S+", kept[0])
    assert re.fullmatch(rf"{TABLE}  snapshot \(initial\) to \S+: [\d,]+ rows in [\d.]+s, build [\d.]+s", kept[1])
    assert kept[2].startswith(f"{TABLE}: buffer at ") and "wrote snapshot@" in kept[2]
    assert "DEBUG" not in done.stdout + done.stderr and "STEP_START" not in done.stdout + done.stderr
    assert_dagster_events(log, "snapshot_job")
    assert "snapshot_assets.run_once - public.users: catching up" in log.read_text()  # Python logging, too


def test_run_once_on_a_terminal_redraws_one_line(work: Path) -> None:
    """A forced snapshot under a pseudo-terminal: redrawn status lines, then the same results."""
    leader, follower = pty.openpty()
    command = [SNAPSHOTTER, "run", "--once", "--force-snapshot", "--config", str(work / "run.conf")]
    proc = subprocess.Popen(command, cwd=work, env=e2e_env(COLUMNS="160"), stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side closed: the process is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0, proc.stderr.read().decode() if proc.stderr else ""
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    assert "\r\x1b[K" in text  # the live line was redrawn in place
    screen = [ln.split("\r\x1b[K")[-1] for ln in text.split("\n") if ln.split("\r\x1b[K")[-1]]
    assert len(screen) == 4, screen  # event log, ingested, the snapshot, the summary: nothing else stays
    assert re.fullmatch(rf"{TABLE}  snapshot \(forced\) to \S+: [\d,]+ rows in [\d.]+s, build [\d.]+s", screen[2])
    assert_dagster_events(event_log(screen[0]), "snapshot_job")


# Runs `snapshotter run --once` in a fresh interpreter and prints which heavy packages it imported.
_IMPORTED = """
import sys
from snapshot_assets.cli import main
code = main(sys.argv[1:])
print("imported:", sorted({m.split(".")[0] for m in sys.modules} & {"dagster", "dagster_aws", "pyspark"}))
sys.exit(code)
"""


def test_run_once_with_nothing_to_do_imports_neither_dagster_nor_spark(work: Path) -> None:
    """After the runs above the archive is at the buffer's head: the pass ingests nothing new,
    decides there is nothing to write, and never loads Dagster, dagster-aws or PySpark (seconds
    of imports every such run would pay: the fixed cost in docs/benchmarks.md)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _IMPORTED, "run", "--once", "--config", str(work / "run.conf")],
                          cwd=work, env=e2e_env(), capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = results(done.stdout.splitlines()[1:], time.monotonic() - started)
    assert lines[-2].startswith(f"{TABLE}: buffer at ") and lines[-2].endswith("wrote nothing new"), lines
    assert lines[-1] == "imported: []", lines

def test_demo_is_compact_and_says_what_it_leaves_running(work: Path) -> None:
    """The quick start's demo (five cycles, one re-base) reusing the warm server of the tests above."""
    done, seconds = run(work, "demo", "--dir", str(work / "demo"))
    lines = done.stdout.splitlines()
    log = event_log(lines[0])
    assert log == work / "demo" / "events.log"
    assert_dagster_events(log, "snapshot_job", "diff_job")
    kept = results(lines[1:], seconds)
    live = kept[:kept.index("")]  # the cycles; then the manifest, the checks and the last lines
    assert live[0].startswith("demo: public.users from the generator, 5 cycles of 3000 changes")
    ingested = [ln for ln in live if ln.startswith(f"{TABLE}  ingested ")]
    artifacts = [ln for ln in live if re.match(rf"{TABLE}  (snapshot|diff) \(\w+\) to \S+: [\d,]+ \w+ in ", ln)]
    assert len(ingested) == 5 and len(live) == 1 + len(ingested) + len(artifacts), live  # nothing else
    assert artifacts[0].startswith(f"{TABLE}  snapshot (initial)")
    assert sum(" snapshot (" in a for a in artifacts) >= 2, artifacts  # the demo's re-base
    tail = kept[len(live):]
    assert len(tail) <= 17 + len(artifacts), tail  # manifest (10 + a row per artifact), verify, 3 rebuilds, 2 last
    assert "DEBUG" not in done.stdout + done.stderr
    status = server_status(work / ".snapshotter" / "spark-connect")
    assert status is not None  # the server the first test started, reused warm, still running
    assert lines[-1].startswith(f"left running: the local Spark Connect server (pid {status.info.pid}, ")
    # the demo's configuration sets no idle time: the default, now recorded for the server it reused
    assert re.search(r"it stops in 1\dm\d+s unless a session starts \(15m00s idle\)", lines[-1]), lines[-1]
