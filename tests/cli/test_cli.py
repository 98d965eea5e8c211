"""The `snapshotter` CLI over the shipped sample archive and over broken archives."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from snapshot_assets.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample-archive"
BIG = 9007199254740993

# The table of examples/sample-archive at each boundary (see scripts/make_sample_archive.py).
EXPECTED = {
    "0/016B3748": {1: "alice", 2: "bob", 3: "carol", 4: "dave"},
    "0/016B3800": {1: "alice", 2: "robert", 4: "dave", 5: "erin"},
    "0/016B3900": {1: "alice", 2: "robert", 4: "dave", 5: "erin", 1000000: "million"},
    "0/016B3A00": {1: "alice", 2: "robert", 5: "erin", 1000000: "million"},
    "0/016B3B10": {1: "alice", 2: "robert", 5: "erin", 1000000: "million", 6: "frank"},
}


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(args), out=out)
    return code, out.getvalue()


def loc(path: Path = SAMPLE) -> list[str]:
    return ["--store", "local", "--path", str(path), "--key-prefix", "users/"]


@pytest.mark.parametrize("fmt", ["jsonl", "protobuf"])
@pytest.mark.parametrize("position", sorted(EXPECTED))
def test_sample_archive_rebuilds_at_every_boundary(fmt: str, position: str) -> None:
    code, out = run("reconstruct", *loc(), "--format", fmt, "--at", position)
    assert code == 0
    doc = json.loads(out)
    assert doc["position"] == position
    assert {int(r["id"]): r["name"] for r in doc["rows"]} == EXPECTED[position]
    assert doc["row_count"] == len(EXPECTED[position])


def test_head_default_jsonl_output_keeps_big_integers_exact() -> None:
    code, out = run("reconstruct", *loc(), "--output", "jsonl")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert {r["id"] for r in rows} == set(EXPECTED["0/016B3B10"])
    alice = next(r for r in rows if r["id"] == 1)
    assert alice["balance"] == BIG and alice["score"] == 43.75
    assert next(r for r in rows if r["id"] == 1000000)["balance"] == -BIG


def test_between_boundaries_reports_effective_position() -> None:
    code, out = run("reconstruct", *loc(), "--at", "0/016B3850")
    assert code == 0 and json.loads(out)["position"] == "0/016B3800"


def test_inspect_and_verify_sample() -> None:
    code, out = run("inspect", *loc())
    assert code == 0 and "public.users" in out and "0/016B3B10" in out and "protobuf" in out
    code, out = run("verify", *loc())
    assert code == 0 and out.startswith("ok:")


def test_console_script_runs() -> None:
    exe = Path(sys.executable).with_name("snapshotter")
    proc = subprocess.run([str(exe), "reconstruct", *loc(), "--at", "0/016B3748"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["row_count"] == 4


def _broken(tmp_path: Path) -> Path:
    copy = tmp_path / "archive"
    shutil.copytree(SAMPLE, copy)
    return copy


def test_position_before_archive_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run("reconstruct", *loc(), "--at", "0/00000001")
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot reach position 0/00000001" in err and "0/016B3748" in err


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: (p / "users/manifest.json").unlink(), "no manifest at"),
        (lambda p: (p / "users/manifest.json").write_text("{nope"), "not valid JSON"),
        (lambda p: (p / "users/manifest.json").write_text('{"manifest_version": 9}'), "manifest_version 9"),
    ],
    ids=["missing", "corrupt", "newer"],
)
def test_bad_manifest_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: object,
                              message: str) -> None:
    path = _broken(tmp_path)
    damage(path)  # type: ignore[operator]
    for cmd in ("reconstruct", "inspect", "verify"):
        code, out = run(cmd, *loc(path))
        assert code == 1
        assert message in capsys.readouterr().err + out  # verify reports problems on stdout


def test_bad_position_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run("reconstruct", *loc(), "--at", "last tuesday")
    assert code == 1 and "not a PostgreSQL LSN" in capsys.readouterr().err


def test_verify_names_each_problem(tmp_path: Path) -> None:
    path = _broken(tmp_path)
    (path / "users/epoch=1/diff-0_016B3748-0_016B3800.pb").unlink()
    with open(path / "users/epoch=2/snapshot-0_016B3A00.jsonl", "ab") as f:
        f.write(b"\n")
    code, out = run("verify", *loc(path))
    assert code == 1
    assert "protobuf object missing" in out and "diff-0_016B3748-0_016B3800.pb" in out
    assert "snapshot@0/016B3A00 (epoch 2): jsonl object is" in out
    assert "2 problem(s) found" in out


def test_missing_object_on_reconstruct_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _broken(tmp_path)
    (path / "users/epoch=2/diff-0_016B3A00-0_016B3B10.jsonl").unlink()
    code, _ = run("reconstruct", *loc(path), "--format", "jsonl")
    assert code == 1 and "object missing" in capsys.readouterr().err
