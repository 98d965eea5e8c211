"""The live view's two renderings: redrawn in place on a terminal, short plain lines anywhere else."""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path

import pytest

from snapshot_assets.progress import PLAIN_EVERY_S, LiveView, Tasks
from snapshot_assets.run_output import KEEP_LOGS, command_output, default_log_path


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_only_for_results_and_phases_that_last() -> None:
    out, clock = io.StringIO(), Clock()
    view = LiveView(out, live=False, clock=clock)
    with view:
        view.status("t", "ingest", "10 changes")  # a quick phase: no line
        clock.now += 1
        view.status("t", "ingest", "20 changes")
        view.result("t", "ingested 20 changes")
        view.status("t", "snapshot (initial)", "build")
        for _ in range(int(3 * PLAIN_EVERY_S)):  # a long one: a line every PLAIN_EVERY_S
            clock.now += 1
            view.status("t", "snapshot (initial)", "build", tasks=Tasks(3, 4, 2))
        view.result("t", "snapshot (initial) to 0/1: 5 rows in 30.0s")
    lines = out.getvalue().splitlines()
    assert lines[0] == "t  ingested 20 changes" and lines[-1] == "t  snapshot (initial) to 0/1: 5 rows in 30.0s"
    progress = lines[1:-1]
    assert len(progress) == 3 and all("[###############.....]  75% spark action 2: 3/4 tasks" in ln for ln in progress)
    assert [ln.rsplit(" ", 1)[1] for ln in progress] == ["10s", "20s", "30s"]
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_a_terminal_gets_one_redrawn_line_and_the_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # the redrawn line is cut to the terminal's width: not this one's
    out, clock = io.StringIO(), Clock()
    view = LiveView(out, live=True, clock=clock)
    with view:
        view.line("event log: x.log")
        view.status("t", "ingest", "10 changes")
        clock.now += 2
        view.status("t", "ingest", "20 changes")
        view.result("t", "ingested 20 changes")
        view.status("t", "diff (diff_interval)", "build", tasks=Tasks(1, 2, 1))
    text = out.getvalue()
    assert text.startswith("event log: x.log\n\r\x1b[Kt  ingest  10 changes  0s\r\x1b[Kt  ingest  20 changes  2s")
    assert "\r\x1b[Kt  ingested 20 changes\n" in text
    # the line of an unfinished phase stays visible when the view closes (an error message follows it)
    assert text.endswith("t  diff (diff_interval)  build  [##########..........]  50% spark action 1: 1/2 tasks  0s\n")
    # what stays on screen: each line as its last redraw left it
    assert [ln.split("\r\x1b[K")[-1] for ln in text.split("\n")[:-1]] == [
        "event log: x.log", "t  ingested 20 changes",
        "t  diff (diff_interval)  build  [##########..........]  50% spark action 1: 1/2 tasks  0s"]


def test_notes_go_to_their_stream_without_breaking_the_line() -> None:
    out, err = io.StringIO(), io.StringIO()
    view = LiveView(out, live=True)
    view.status("t", "ingest", "1 change")
    view.note("warning: slot busy", stream=err)
    assert err.getvalue() == "warning: slot busy\n"
    assert out.getvalue().count("t  ingest  1 change") == 2  # cleared for the note, drawn again after it


def test_event_logs_are_new_files_and_the_oldest_go(tmp_path: Path) -> None:
    old = [tmp_path / f"run-once-202611{day:02d}T000000Z.log" for day in range(1, KEEP_LOGS + 5)]
    for path in old:
        path.write_text("x")
    new = default_log_path(tmp_path, "run-once")
    assert new.name.startswith("run-once-") and new not in old
    assert sorted(tmp_path.iterdir()) == old[-(KEEP_LOGS - 1):]  # with the new one: KEEP_LOGS


def test_command_output_sends_log_records_and_warnings_to_the_file(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out, path = io.StringIO(), tmp_path / "logs" / "events.log"
    root_handlers, root_level = list(logging.getLogger().handlers), logging.getLogger().level
    with command_output(out, path):
        logging.getLogger("snapshot_assets.some_stage").warning("the slot is busy")
        logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
        warnings.warn("a beta parameter", UserWarning, stacklevel=1)
    assert out.getvalue() == f"event log: {path}\n"
    assert capsys.readouterr().err == "warning: the slot is busy\n"  # the project's own warnings are shown
    text = path.read_text()
    assert "WARNING snapshot_assets.some_stage - the slot is busy" in text
    assert "INFO alembic.runtime.migration - Context impl SQLiteImpl." in text and "a beta parameter" in text
    assert logging.getLogger().handlers == root_handlers and logging.getLogger().level == root_level  # as it was


def test_verbose_output_logs_to_the_terminal_and_leaves_dagster_console_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    from snapshot_assets.definitions import defs

    out = io.StringIO()
    with command_output(out, None) as output:
        logging.getLogger("snapshot_assets.some_stage").info("catching up")
        assert output.event_log is None and not output.view.live
        assert output.run_config(defs.resolve_job_def("snapshot_job"), "public.users") is None  # console logger on
    assert out.getvalue() == ""  # no event log line: there is no file
    assert "INFO snapshot_assets.some_stage - catching up" in capsys.readouterr().err
