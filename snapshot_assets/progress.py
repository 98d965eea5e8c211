"""The live view of `snapshotter run --once` and `snapshotter demo`: one status line per table at work.

What a person follows: ingest (changes made durable, rate, position), then per artifact the
decision and its trigger, the build stage with a bar over the current Spark job's tasks, and a
result line (rows or changes written, seconds). Two renderings of the same updates:
  - on a terminal the current line is redrawn in place (a ticker keeps its seconds moving) and
    only results stay on screen, so five demo cycles leave about ten lines;
  - anywhere else (a pipe, a CI log, a file) results are plain lines, and so is the status of a
    phase that lasts: once it has run for `PLAIN_EVERY_S`, then every `PLAIN_EVERY_S`; a log stays
    short (a quick artifact is one line), shows a long build is alive, and has no control characters.
This module only renders; what feeds it (the ingest loop, Dagster's events, Spark's progress
reports) is `run_output`'s. Updates may come from several threads (the ingest poller, Spark's
client thread, the ticker): one lock orders them.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TextIO

#: In plain mode, the longest silence within one phase (a long build still shows it is alive).
PLAIN_EVERY_S = 10.0
BAR_WIDTH = 20
_CLEAR = "\r\x1b[K"


@dataclass(frozen=True, slots=True)
class Tasks:
    """Progress of the Spark action running now (one Connect operation: a write, a count): its tasks done
    of those known so far, and the action's number within the build."""

    done: int
    total: int
    action: int

    def bar(self) -> str:
        filled = BAR_WIDTH * self.done // self.total if self.total else 0
        percent = 100 * self.done // self.total if self.total else 0
        return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {percent:3d}% spark action {self.action}: " \
               f"{self.done}/{self.total} tasks"


@dataclass(frozen=True, slots=True)
class _Status:
    table: str
    phase: str
    detail: str
    since: float
    tasks: Tasks | None

    def render(self, now: float) -> str:
        bar = f"  {self.tasks.bar()}" if self.tasks is not None and self.tasks.total else ""
        return f"{self.table}  {self.phase}  {self.detail}{bar}  {now - self.since:.0f}s"


class LiveView:
    """Renders status updates and result lines to `out`; live (redrawn) when `out` is a terminal."""

    def __init__(self, out: TextIO, *, live: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.live = _is_terminal(out) if live is None else live
        self.clock = clock
        self._lock = threading.Lock()
        self._status: _Status | None = None
        self._printed: tuple[str, str, float] | None = None  # plain mode: (table, phase, when) of the last line
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # ---- what the pipeline reports -------------------------------------------------------------

    def status(self, table: str, phase: str, detail: str, *, since: float | None = None,
               tasks: Tasks | None = None) -> None:
        """The table's current state (transient): `phase` names what it does, `since` when that began."""
        with self._lock:
            same = self._status is not None and (self._status.table, self._status.phase) == (table, phase)
            start = since if since is not None else self._status.since if same and self._status else self.clock()
            self._status = _Status(table, phase, detail, start, tasks)
            self._show()

    def result(self, table: str, text: str) -> None:
        """A line that stays: something finished (or failed)."""
        with self._lock:
            self._status = None
            self._printed = None
            self._write(f"{_CLEAR if self.live else ''}{table}  {text}\n")

    def note(self, text: str, stream: TextIO | None = None) -> None:
        """A message outside the table lines (a warning): printed on `stream` without breaking the live line."""
        with self._lock:
            if self.live and self._status is not None:
                self._write(_CLEAR)
            target = stream or sys.stderr
            target.write(text.rstrip("\n") + "\n")
            target.flush()
            if self.live and self._status is not None:
                self._show()

    def line(self, text: str) -> None:
        """A plain line of the command's own output (headers, summaries)."""
        with self._lock:
            self._write(f"{_CLEAR if self.live and self._status else ''}{text}\n")
            self._status = None

    # ---- rendering -----------------------------------------------------------------------------

    def _show(self) -> None:
        status = self._status
        if status is None:
            return
        now = self.clock()
        if self.live:
            width = shutil.get_terminal_size((120, 24)).columns - 1
            self._write(_CLEAR + status.render(now)[:width])
            return
        last = self._printed
        quiet_since = last[2] if last is not None and last[:2] == (status.table, status.phase) else status.since
        if now - quiet_since >= PLAIN_EVERY_S:
            self._write(status.render(now) + "\n")
            self._printed = (status.table, status.phase, now)

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                self._show()

    def __enter__(self) -> LiveView:
        if self.live:
            self._ticker = threading.Thread(target=self._tick, name="live-view", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self.live and self._status is not None:
                self._write("\n")  # leave the last state visible (an error follows it)
            self._status = None


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def rate(count: int, seconds: float) -> str:
    """`1,234/s`: a count per second for people."""
    return f"{count / seconds:,.0f}/s" if seconds > 0 else "-"
