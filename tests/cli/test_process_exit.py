"""Processes that load the code location, and the `snapshotter` command, exit with the collector
frozen (snapshot_assets/process_exit.py), after every other exit handler, and with their output whole."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# The probe's exit handler is registered first, so it runs last: it sees what the exit left behind.
PROBE = textwrap.dedent("""
    import atexit, gc, sys
    atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))
    {body}
""")


def _exit_report(body: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE.format(body=body)], capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout


def test_importing_the_definitions_freezes_the_collector_only_at_exit() -> None:
    out = _exit_report("import gc, snapshot_assets.definitions\n"
                       "print('frozen while alive:', gc.get_freeze_count() > 0, flush=True)")
    assert out.splitlines() == ["frozen while alive: False", "frozen at exit: True"], out


def test_the_command_exits_with_the_collector_frozen_and_its_output_whole() -> None:
    body = ("import sys\nfrom snapshot_assets.cli import console\n"
            "sys.argv = ['snapshotter', '--help']\n"
            "try:\n    console()\nexcept SystemExit as e:\n    print('exit', e.code, flush=True)")
    out = _exit_report(body)
    assert "usage: snapshotter" in out and out.splitlines()[-2:] == ["exit 0", "frozen at exit: True"], out


def test_a_process_that_never_loads_them_keeps_its_final_collection() -> None:
    assert _exit_report("import snapshot_assets.archive.gojson").splitlines() == ["frozen at exit: False"]


@pytest.mark.parametrize("calls", [1, 3])
def test_installing_twice_registers_one_handler(calls: int) -> None:
    body = ("import atexit\nfrom snapshot_assets import process_exit\n"
            f"for _ in range({calls}):\n    process_exit.skip_final_collection()\n"
            "print('handlers:', atexit._ncallbacks(), flush=True)")
    lines = _exit_report(body).splitlines()
    assert lines == ["handlers: 2", "frozen at exit: True"], lines
