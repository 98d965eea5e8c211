"""Bad input, a clear answer: the HTTP route (unknown table, bad position, bad expires, unknown
destination), the CLI (`bootstrap`, `pin`, `unpin`: exit 1 and one line naming what is wrong), and
nothing in the archive changed by a refused request."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapshot_assets import cli
from snapshot_assets.bootstrap import BootstrapError, parse_expires
from snapshot_assets.pipeline.table import TablePipeline
from tests.bootstrap.support import SourceArchive, get_json, http_service, table_config


def _config_text(tmp: Path) -> str:
    return f"""snapshotter {{
      source {{ type = generator, table = users }}
      destinations = [ {{ type = local, path = "{tmp / 'archive'}" }} ]
      formats {{ snapshot = [jsonl], diff = [jsonl] }}
      retention {{ keep_epochs = 1, grace = 1h }}
      buffer.path = "{tmp / 'buffer'}"
    }}"""


@pytest.fixture
def archive(tmp_path: Path) -> SourceArchive:
    (tmp_path / "snapshotter.conf").write_text(_config_text(tmp_path))
    a = SourceArchive(TablePipeline(table_config(tmp_path, {"type": "local", "path": str(tmp_path / "archive")})))
    a.snapshot()
    a.diff()
    a.diff()
    return a


@pytest.mark.parametrize(("query", "status", "says"), [
    ("/bootstrap/public.nope", 404, "unknown table 'public.nope': the configured tables are public.users"),
    ("/bootstrap/public.users?position=banana", 400, "position 'banana' is not a PostgreSQL LSN"),
    ("/bootstrap/public.users?position=FF/0", 400, "position FF/0 is after the head 0/00000030"),
    ("/bootstrap/public.users?expires=0", 400, "expires '0' must be between 1s and 7 days"),
    ("/bootstrap/public.users?expires=8d", 400, "expires '8d' must be between 1s and 7 days"),
    ("/bootstrap/public.users?expires=soon", 400, "expires: cannot parse duration 'soon'"),
    ("/bootstrap/public.users?destination=elsewhere", 400, "has no destination 'elsewhere'"),
])
def test_the_route_refuses_bad_input_clearly(archive: SourceArchive, query: str, status: int, says: str) -> None:
    with http_service([archive.pipe]) as service:
        code, body = get_json(service + query)
    assert code == status and says in body["error"]


def test_an_archive_without_a_manifest_is_not_found(tmp_path: Path) -> None:
    empty = TablePipeline(table_config(tmp_path, {"type": "local", "path": str(tmp_path / "void")}))
    with http_service([empty]) as service:
        code, body = get_json(service + "/bootstrap/users")  # the bare table name works as in the config
    assert code == 404 and "no manifest at file://" in body["error"]


@pytest.mark.parametrize(("text", "seconds"), [(None, 3600), ("3600", 3600), ("1h", 3600), ("90m", 5400),
                                               ("7d", 604800)])
def test_expires_accepts_seconds_and_durations(text: str | None, seconds: int) -> None:
    assert parse_expires(text) == seconds
    with pytest.raises(BootstrapError):
        parse_expires("-5")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def test_cli_pin_unpin_and_bootstrap(archive: SourceArchive, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    conf = str(tmp_path / "snapshotter.conf")
    m = archive.manifest()
    snap, diff = m.artifacts[0], m.artifacts[1]
    before = m.dumps()

    code, _, err = _cli(capsys, "pin", "--config", conf, "--table", "public.users", "--position", diff.to_position)
    assert code == 1 and f"{diff.to_position} is the end of diff" in err and "only snapshots can be pinned" in err
    code, _, err = _cli(capsys, "pin", "--config", conf, "--table", "public.users", "--position", "9/0")
    assert code == 1 and "has no snapshot at '9/0' (snapshots: 0/00000010)" in err
    code, _, err = _cli(capsys, "pin", "--config", conf, "--table", "public.nope", "--position", "0/10")
    assert code == 1 and "no table 'public.nope'" in err
    assert archive.manifest().dumps() == before  # nothing refused changed the archive

    code, out, _ = _cli(capsys, "pin", "--config", conf, "--table", "users", "--position", snap.to_position,
                        "--label", "golden")
    assert code == 0 and "pinned snapshot@0/00000010 (epoch 1) as 'golden'" in out
    code, out, _ = _cli(capsys, "inspect", "--path", str(tmp_path / "archive"), "--key-prefix", "users/")
    assert code == 0 and "golden (user)" in out
    code, out, _ = _cli(capsys, "unpin", "--config", conf, "--table", "users", "--position", snap.to_position)
    assert code == 0 and "unpinned snapshot@0/00000010" in out
    code, _, err = _cli(capsys, "unpin", "--config", conf, "--table", "users", "--position", snap.to_position)
    assert code == 1 and "is not pinned" in err

    code, out, _ = _cli(capsys, "bootstrap", "--config", conf, "--table", "users", "--position", diff.to_position,
                        "--expires", "2h")
    assert code == 0 and '"mode": "diffs"' in out and '"expires_in": 7200' in out
    code, _, err = _cli(capsys, "bootstrap", "--config", conf, "--table", "users", "--expires", "forever")
    assert code == 1 and "snapshotter bootstrap: expires: cannot parse duration 'forever'" in err
