"""Secrets never leave: run real things with secret values and grep everything they produced.

The secrets: the password of a PostgreSQL DSN (the private cluster's real one, and wrong ones),
an AWS secret access key and session token (in the environment of the processes, accepted by
moto_server), and the contents of a private key file a configuration points at or includes. What
is grepped: error messages, the CLI's stdout and stderr, logs, `snapshotter status` (text and
JSON), the metrics endpoint, and after a real `snapshotter run --once` (PostgreSQL source, S3
destination on moto_server, Spark) every file of the Dagster instance directory (run and event
storage, compute logs), of the change buffer and of the Spark working directory, and every object
written to the bucket.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from resources.subscribers.errors import SourceError
from resources.subscribers.postgres import PostgresSubscriber
from snapshot_assets.config import ConfigError, load_config, parse_config
from tests.aws.support import bucket, client
from tests.conftest import _free_port
from tests.e2e.conftest import e2e_env
from tests.pg.conftest import PgCluster

SNAPSHOTTER = str(Path(sys.executable).with_name("snapshotter"))
AWS_SECRET = "AwsSecret-" + secrets.token_hex(12)
AWS_TOKEN = "AwsSessionToken-" + secrets.token_hex(12)
KEY_MARKER = "KeyFileContents" + secrets.token_hex(8)


def _wrong_password() -> str:
    return "WrongPw-" + secrets.token_hex(8)


def _assert_clean(text: str, *values: str, where: str) -> None:
    for value in values:
        assert value not in text, f"{where} contains a secret: ...{text[max(0, text.find(value) - 200):][:400]}..."


def _files(*roots: Path) -> Iterator[tuple[Path, bytes]]:
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink():
                yield path, path.read_bytes()


def _grep_tree(values: tuple[str, ...], *roots: Path) -> int:
    count = 0
    for path, data in _files(*roots):
        count += 1
        for value in values:
            assert value.encode() not in data, f"{path} contains a secret"
    return count


def _snapshotter(*args: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SNAPSHOTTER, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _pg_config(work: Path, dsn: str, destinations: str, *, table: str = "leak_check") -> Path:
    path = work / "snapshotter.conf"
    path.write_text(f"""snapshotter {{
  source {{ type = postgres, schema = public, table = {table}, dsn = {json.dumps(dsn)} }}
  destinations = [ {destinations} ]
  formats {{ snapshot = [jsonl, protobuf, parquet], diff = [jsonl, protobuf] }}
  buffer {{ path = {json.dumps(str(work / "buffer"))}, seal_interval = 200ms }}
}}
""")
    return path


# --- PostgreSQL connection failures ------------------------------------------------------------


def _source_error(dsn: str) -> SourceError:
    subscriber = PostgresSubscriber(dsn, table="leak_check", slot="leak_check", publication="leak_check")
    try:
        with pytest.raises(SourceError) as raised:
            next(iter(subscriber.events(None)))
    finally:
        subscriber.close()
    return raised.value


def test_refused_password_and_wrong_port_errors_carry_no_password(pg_cluster: PgCluster,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    wrong = _wrong_password()
    refused = _source_error(pg_cluster.dsn(password=wrong))
    assert "password authentication failed" in str(refused), refused
    unreachable = _source_error(pg_cluster.dsn(port=_free_port()))
    assert "Connection refused" in str(unreachable) or "connect" in str(unreachable), unreachable
    uri = f"postgresql://{pg_cluster.user}:{wrong}@127.0.0.1:{pg_cluster.port}/{pg_cluster.dbname}"
    refused_uri = _source_error(uri)
    for error in (refused, unreachable, refused_uri):
        _assert_clean(f"{error} {error.cause} {error!r}", wrong, pg_cluster.password, where="the source error")
    _assert_clean(caplog.text, wrong, pg_cluster.password, where="the logs")


def test_a_dsn_libpq_cannot_parse_is_explained_without_quoting_it(pg_cluster: PgCluster) -> None:
    secret_tail = "tail-" + secrets.token_hex(6)
    dsn = f"host=127.0.0.1 port={pg_cluster.port} password=Head {secret_tail} dbname=x"
    error = _source_error(dsn)
    assert "not a valid libpq connection string" in str(error), error
    _assert_clean(str(error), secret_tail, where="the source error")


# --- configuration errors ----------------------------------------------------------------------

PASSWORD = "CfgPw-" + secrets.token_hex(8)
DSN = f"host=127.0.0.1 port=5 user=app password={PASSWORD} dbname=prod"
DESTINATIONS = '{ type = local, path = "/tmp/never-written" }'


@pytest.mark.parametrize(("body", "names"), [
    (f'source {{ type = postgres, table = t, dsn = "{DSN}" }}, diff.interval = banana', "diff.interval"),
    (f'source {{ type = postgres, table = t, dsn = "{DSN}", slot = {{ dsn = "{DSN}" }} }}', "source.slot"),
    (f'tables = {{ source {{ type = postgres, table = t, dsn = "{DSN}" }} }}', "tables"),
    (f'source {{ type = postgres, table = t, dsn = "{DSN}" }}, key_fields = {{ a = "{DSN}" }}', "key_fields"),
    (f'source {{ type = postgres, table = t, dsn = "postgresql://app:{PASSWORD}@h/db", protocol = x }}',
     "source.protocol"),
    (f'source {{ type = postgres, table = t, dsn = "host=h password={PASSWORD} broken" }}', "source.dsn"),
    (f'source {{ type = postgres, table = t, dsn = "{DSN}" \n bad syntax here = = }}', "syntax error at line"),
], ids=["interval", "slot", "tables", "key_fields", "protocol", "dsn", "syntax"])  # no password in a test id
def test_config_errors_name_the_key_not_the_password(body: str, names: str) -> None:
    text = f"snapshotter {{ {body}, destinations = [ {DESTINATIONS} ] }}"
    with pytest.raises(ConfigError) as raised:
        parse_config(text, file="app.conf", env={})
    assert names in str(raised.value), raised.value
    _assert_clean(str(raised.value), PASSWORD, where="the config error")


def test_config_errors_echo_no_file_contents(tmp_path: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text(f"-----BEGIN PRIVATE KEY-----\nMIIEvQ{KEY_MARKER}\n{KEY_MARKER}AAAA\n-----END PRIVATE KEY-----\n")
    source = "source { type = generator, table = t }"
    for text in (f'include "{key}"\nsnapshotter {{ {source}, destinations = [ {DESTINATIONS} ] }}',
                 f'snapshotter {{ include "{key}"\n {source}, destinations = [ {DESTINATIONS} ] }}',
                 f'snapshotter {{ {source}, destinations = [ {DESTINATIONS} ], tls = {{ key_file = "{key}" }},'
                 f' key = """{key.read_text()}""" }}'):
        conf = tmp_path / "app.conf"
        conf.write_text(text)
        with pytest.raises(ConfigError) as raised:
            load_config(conf, env={})
        _assert_clean(str(raised.value), KEY_MARKER, where="the config error")
        done = _snapshotter("status", "--config", str(conf), cwd=tmp_path, env=e2e_env())
        assert done.returncode == 1 and "app.conf" in done.stderr, done.stderr
        _assert_clean(done.stdout + done.stderr, KEY_MARKER, where="the CLI output")


# --- status and metrics ------------------------------------------------------------------------


def test_status_and_metrics_show_no_password(pg_cluster: PgCluster, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    wrong = _wrong_password()
    for dsn, password in ((pg_cluster.dsn(), pg_cluster.password), (pg_cluster.dsn(password=wrong), wrong)):
        config = _pg_config(tmp_path, dsn, f'{{ type = local, path = {json.dumps(str(archive))} }}')
        env = e2e_env(DAGSTER_HOME=str(tmp_path / "dagster"))
        (tmp_path / "dagster").mkdir(exist_ok=True)
        for output in ("table", "json"):
            done = _snapshotter("status", "--config", str(config), "--output", output, cwd=tmp_path, env=env)
            assert "public.leak_check" in done.stdout, done.stdout + done.stderr
            _assert_clean(done.stdout + done.stderr, password, pg_cluster.password, where=f"status ({output})")
        port = _free_port()
        server = subprocess.Popen([SNAPSHOTTER, "serve-metrics", "--config", str(config), "--host", "127.0.0.1",
                                   "--port", str(port), "--interval", "0.5"], cwd=tmp_path, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            metrics = _scrape(f"http://127.0.0.1:{port}/metrics", server)
        finally:
            server.terminate()
            logs, _ = server.communicate(timeout=30)
        assert 'snapshotter_destination_up{' in metrics, metrics[-2000:]
        _assert_clean(metrics + logs, password, pg_cluster.password, where="the metrics endpoint and its logs")


def _scrape(url: str, server: subprocess.Popen[str], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, "serve-metrics exited"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text: str = response.read().decode()
            if "snapshotter_destination_up{" in text:
                return text
        except OSError:
            pass
        time.sleep(0.2)  # polling a server that is starting, bounded by the deadline
    raise AssertionError(f"no metrics at {url} within {timeout:g}s")


# --- a whole run -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.s3
def test_a_run_with_secrets_everywhere_writes_them_nowhere(pg_cluster: PgCluster, moto_server: str,
                                                           spark_work: Path, tmp_path: Path) -> None:
    with contextlib.closing(pg_cluster.connect()) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS leak_run; CREATE TABLE leak_run (id int PRIMARY KEY, name text); "
                    "ALTER TABLE leak_run REPLICA IDENTITY FULL")
        cur.execute("INSERT INTO leak_run SELECT g, 'row ' || g FROM generate_series(1, 50) g")
    name = bucket(moto_server)
    destination = json.dumps({"type": "s3", "bucket": name, "prefix": "leaks/", "endpoint_url": moto_server,
                              "path_style": True, "region": "us-east-1"})
    config = _pg_config(tmp_path, pg_cluster.dsn(), destination, table="leak_run")
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    env = e2e_env(DAGSTER_HOME=str(dagster_home), AWS_SECRET_ACCESS_KEY=AWS_SECRET, AWS_SESSION_TOKEN=AWS_TOKEN)
    values = (pg_cluster.password, AWS_SECRET, AWS_TOKEN)
    runs = [_snapshotter("run", "--once", "--config", str(config), cwd=spark_work, env=env, timeout=600)]
    with contextlib.closing(pg_cluster.connect()) as conn, conn.cursor() as cur:
        cur.execute("UPDATE leak_run SET name = 'changed' WHERE id <= 10")
    runs.append(_snapshotter("run", "--once", "--config", str(config), cwd=spark_work, env=env, timeout=600))
    runs.append(_snapshotter("status", "--config", str(config), "--output", "json", cwd=spark_work, env=env))
    for done in runs[:2]:
        assert done.returncode == 0, done.stderr[-3000:]
    assert "wrote snapshot" in runs[0].stdout and "wrote diff" in runs[1].stdout, [r.stdout for r in runs]
    for done in runs:
        _assert_clean(done.stdout + done.stderr, *values, where=f"`{' '.join(done.args[1:3])}` output")
    files = _grep_tree(values, dagster_home, tmp_path / "buffer", spark_work)
    assert files > 0
    s3 = client("s3", moto_server)
    objects = s3.list_objects_v2(Bucket=name)["Contents"]
    assert any(o["Key"].endswith("manifest.json") for o in objects)
    for obj in objects:
        data = s3.get_object(Bucket=name, Key=obj["Key"])["Body"].read()
        for value in values:
            assert value.encode() not in data, f"s3://{name}/{obj['Key']} contains a secret"
