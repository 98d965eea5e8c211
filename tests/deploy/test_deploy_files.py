"""deploy/: the Dockerfile, the compose file and the production dagster.yaml, checked without Docker.

Nothing here can be built or started with Docker on the machines the tests run on, so every
reference is checked against the repository instead: each COPY source exists and the image gets
every package pyproject.toml installs; each command a service of the project's image runs is an
installed console script whose own CLI parser accepts the arguments, and each file it names is a
repository file copied into the image; the services agree on hosts, ports, buckets and the
environment the production dagster.yaml and deploy/snapshotter.conf read. The code server and the
one-shot sensor command then run for real (on SQLite), as the compose file runs them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlparse

import click
import dagster as dg
import pytest
import yaml  # type: ignore[import-untyped]  # (no stubs installed; only safe_load/safe_dump used)
from dagster._cli import cli as dagster_cli
from dagster._daemon.cli import cli as daemon_cli
from dagster_webserver.cli import dagster_webserver

from snapshot_assets.cli import build_parser
from snapshot_assets.config import load_config
from snapshot_assets.spark.connect_server import SERVER_CLASS
from tests.deploy.deploy_files import (
    COMPOSE,
    DEPLOY,
    Instruction,
    dagster_yaml_env_names,
    dockerfile_env,
    dockerfile_instructions,
    parse_click,
    repo_path_in_image,
    workdir,
)
from tests.deploy.deploy_files import compose as load_compose
from tests.deploy.deploy_files import copied as copied_sources
from tests.e2e.conftest import REPO, e2e_env
from tests.e2e.instance_storage import POSTGRES_YAML, sqlite_storage

IMAGE_SERVICES: Final = ("spark-connect", "code-server", "ingest-supervisor-off", "webserver", "daemon", "ingest")
# console script -> (the module its `main` is in, the click command that `main` runs)
CLICK_CLIS: Final[dict[str, tuple[str, click.Command]]] = {
    "dagster": ("dagster._cli", dagster_cli),
    "dagster-webserver": ("dagster_webserver.cli", dagster_webserver),
    "dagster-daemon": ("dagster._daemon.cli", daemon_cli),
}
FILE_PARAMS: Final = ("workspace", "python_file")
START_DEADLINE_S: Final = 180.0


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return dockerfile_instructions()


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = load_compose()["services"]
    return found


def image_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services that run the project's image (built from deploy/Dockerfile)."""
    return {name: spec for name, spec in services.items() if "build" in spec}


# --- the Dockerfile ---------------------------------------------------------------------------


def test_dockerfile_copies_existing_files_and_every_package(instructions: list[Instruction]) -> None:
    sources = [source for source, _ in copied_sources(instructions)]
    assert sources, "the Dockerfile copies nothing"
    missing = [s for s in sources if not (REPO / s).exists()]
    assert not missing, f"COPY sources not in the repository: {missing}"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    needed = ["pyproject.toml", pyproject["project"]["readme"], "scripts/setup.sh", *packages]
    assert not [n for n in needed if n not in sources], f"the install needs {needed}, the image copies {sources}"


def test_dockerfile_installs_through_the_tests_setup_script(instructions: list[Instruction]) -> None:
    runs = [i.args for i in instructions if i.keyword == "RUN"]
    assert "bash scripts/setup.sh" in runs, runs
    assert "bash scripts/setup.sh" in (REPO / "scripts" / "test.sh").read_text(), "the tests install otherwise"
    assert ".venv/bin/python" in (REPO / "scripts" / "setup.sh").read_text()  # the venv it creates
    env = dockerfile_env(instructions)
    venv = workdir(instructions) / ".venv"
    assert env["PYSPARK_PYTHON"] == f"{venv}/bin/python", "Spark's Python workers run another interpreter"
    assert env["PATH"].startswith(f"{venv}/bin:"), "the venv's console scripts are not first on PATH"
    config = repo_path_in_image(env["SNAPSHOTTER_CONFIG"], instructions)
    assert config is not None and config.is_file(), env["SNAPSHOTTER_CONFIG"]
    # The instance configuration the image installs is the production one.
    installs = [r for r in runs if "dagster.yaml" in r]
    assert len(installs) == 1 and f"cp deploy/{POSTGRES_YAML.name} \"$DAGSTER_HOME/dagster.yaml\"" in installs[0]
    assert repo_path_in_image(f"deploy/{POSTGRES_YAML.name}", instructions) == POSTGRES_YAML


# --- the compose file: commands ---------------------------------------------------------------


def _check_files(params: dict[str, Any], instructions: list[Instruction], what: str) -> None:
    for name in FILE_PARAMS:
        values = params.get(name) or ()
        for value in (values,) if isinstance(values, str) else values:
            path = repo_path_in_image(value, instructions)
            assert path is not None and path.is_file(), f"{what}: {value} is not a repository file in the image"


def check_command(argv: list[str], instructions: list[Instruction], what: str) -> dict[str, Any]:
    """`argv` runs an installed console script whose CLI accepts the arguments; its parsed parameters."""
    program, *args = argv
    if program == "spark-submit":  # installed by pyspark into the venv's bin, not an entry point
        assert (Path(sys.executable).parent / program).is_file(), f"{what}: no {program} in the venv"
        assert args[args.index("--class") + 1] == SERVER_CLASS and args[-1] == "spark-internal", what
        return {"conf": dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")}
    (script,) = entry_points(group="console_scripts", name=program) or pytest.fail(f"{what}: {program} not installed")
    if program == "snapshotter":
        assert script.value == "snapshot_assets.cli:console", script.value
        try:
            namespace: argparse.Namespace = build_parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{what}: snapshotter rejects {args}")
        params = vars(namespace)
        if params.get("config"):
            path = repo_path_in_image(params["config"], instructions)
            assert path is not None and path.is_file(), f"{what}: --config {params['config']} is not in the image"
        return params
    module, cli = CLICK_CLIS[program]
    assert script.value == f"{module}:main", f"{program} is {script.value}"
    try:
        _, parsed = parse_click(cli, args)
    except click.ClickException as e:
        pytest.fail(f"{what}: {program} rejects {args}: {e.format_message()}")
    params = dict(parsed)
    _check_files(params, instructions, what)
    if params.get("module_name"):
        modules = (params["module_name"],) if isinstance(params["module_name"], str) else params["module_name"]
        assert all(importlib.util.find_spec(m) for m in modules), f"{what}: {modules} not importable"
    return params


def test_every_command_of_the_image_is_an_entry_point_that_accepts_it(
        services: dict[str, dict[str, Any]], instructions: list[Instruction]) -> None:
    ours = image_services(services)
    assert sorted(ours) == sorted(IMAGE_SERVICES), sorted(ours)
    for name, spec in ours.items():
        assert spec["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}, name
        assert (COMPOSE.parent / spec["build"]["context"] / spec["build"]["dockerfile"]).resolve() == \
            (DEPLOY / "Dockerfile").resolve()
        check_command(spec["command"], instructions, f"service {name}")
        health = spec.get("healthcheck", {}).get("test")
        if health:
            assert health[0] == "CMD", f"{name}: healthcheck in exec form"
            check_command(health[1:], instructions, f"healthcheck of {name}")


def test_the_sensor_the_ingest_service_replaces_exists(services: dict[str, dict[str, Any]],
                                                      instructions: list[Instruction]) -> None:
    from snapshot_assets.definitions import defs

    params = check_command(services["ingest-supervisor-off"]["command"], instructions, "ingest-supervisor-off")
    assert params["sensor_name"] in {s.name for s in defs.sensors or ()}
    assert services["daemon"]["depends_on"]["ingest-supervisor-off"]["condition"] == "service_completed_successfully"
    assert services["ingest"]["command"][:2] == ["snapshotter", "ingest"]


def test_every_external_image_is_pinned_to_a_name(services: dict[str, dict[str, Any]]) -> None:
    others = {name: spec for name, spec in services.items() if "build" not in spec}
    assert sorted(others) == ["dagster-postgres", "s3", "s3-bucket"], sorted(others)
    assert all(spec.get("image") for spec in others.values())


# --- the compose file: wiring -----------------------------------------------------------------


def test_services_agree_on_hosts_ports_and_names(services: dict[str, dict[str, Any]],
                                                 instructions: list[Instruction]) -> None:
    for name, spec in services.items():
        depends = spec.get("depends_on", [])
        assert set(depends) <= set(services), f"{name} depends on unknown services {depends}"
    workspace = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())
    (location,) = workspace["load_from"]
    grpc = location["grpc_server"]
    code = check_command(services[grpc["host"]]["command"], instructions, "code-server")
    assert (code["port"], code["location_name"]) == (grpc["port"], grpc["location_name"])
    assert code["host"] == "0.0.0.0"  # reachable from the other containers
    health = check_command(services[grpc["host"]]["healthcheck"]["test"][1:], instructions, "health")
    assert health["port"] == grpc["port"]
    for name in ("webserver", "daemon", "ingest-supervisor-off"):
        params = check_command(services[name]["command"], instructions, name)
        assert params["workspace"] == ("deploy/workspace.yaml",), name

    env = services["code-server"]["environment"]
    spark = urlparse(env["SNAPSHOTTER_SPARK_REMOTE"])
    conf = check_command(services["spark-connect"]["command"], instructions, "spark-connect")["conf"]
    assert (spark.scheme, spark.hostname, str(spark.port)) == \
        ("sc", "spark-connect", conf["spark.connect.grpc.binding.port"])
    assert conf["spark.connect.grpc.binding.address"] == "0.0.0.0"
    for url in (env["SNAPSHOTTER_S3_ENDPOINT"], env["AWS_ENDPOINT_URL_S3"]):
        assert urlparse(url).hostname in services, url
    bucket_command = " ".join(services["s3-bucket"]["command"])
    assert f"mc mb --ignore-existing s3/{env['SNAPSHOTTER_BUCKET']}" in bucket_command
    assert env["DAGSTER_COMPUTE_LOGS_BUCKET"] == env["SNAPSHOTTER_BUCKET"]
    keys = services["s3"]["environment"]
    assert (keys["MINIO_ROOT_USER"], keys["MINIO_ROOT_PASSWORD"]) == \
        (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])

    pg = services[env["DAGSTER_PG_HOST"]]["environment"]
    assert (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"]) == \
        (env["DAGSTER_PG_USER"], env["DAGSTER_PG_PASSWORD"], env["DAGSTER_PG_DB"])
    aws_config = repo_path_in_image(env["AWS_CONFIG_FILE"], instructions)
    assert aws_config is not None and "addressing_style = path" in aws_config.read_text()


def test_every_image_service_has_what_the_production_instance_reads(services: dict[str, dict[str, Any]]) -> None:
    needed = dagster_yaml_env_names(POSTGRES_YAML)
    assert {"DAGSTER_PG_HOST", "DAGSTER_PG_PASSWORD", "DAGSTER_COMPUTE_LOGS_BUCKET"} <= needed, needed
    for name, spec in image_services(services).items():
        assert not needed - set(spec["environment"]), f"{name} lacks {sorted(needed - set(spec['environment']))}"


def test_the_deployment_config_loads_with_the_services_environment(services: dict[str, dict[str, Any]],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    env = services["code-server"]["environment"]
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.delenv("SNAPSHOTTER_BUFFER", raising=False)
    config = load_config(DEPLOY / "snapshotter.conf", env={})
    assert config.spark.remote == env["SNAPSHOTTER_SPARK_REMOTE"]
    for table in config.tables:
        (destination,) = table.destinations
        assert (destination["type"], destination["bucket"], destination["endpoint_url"]) == \
            ("s3", env["SNAPSHOTTER_BUCKET"], env["SNAPSHOTTER_S3_ENDPOINT"])
        assert table.buffer.path == f"s3://{env['SNAPSHOTTER_BUCKET']}/work", "the working root is not in S3"
        assert table.buffer.s3["endpoint_url"] == env["SNAPSHOTTER_S3_ENDPOINT"]
    for name, spec in image_services(services).items():  # the services share no disk
        assert not spec.get("volumes"), f"{name} mounts {spec['volumes']}"


def test_production_instance_has_the_local_run_queue() -> None:
    """One set of run-queue limits (one writer per table, the artifact-run cap) on both instances."""
    production = yaml.safe_load(POSTGRES_YAML.read_text())
    assert production["run_queue"] == sqlite_storage().run_queue()
    assert "postgres" in production["storage"]


# --- the code server and the sensor command, run as compose runs them -------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _poll(probe: Callable[[], bool], timeout_s: float, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if process.poll() is not None:
            pytest.fail(f"the code server exited with {process.returncode} before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f}s:\n{log.read_text()[-3000:]}")
        time.sleep(1)


@contextlib.contextmanager
def _running(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


@pytest.mark.slow
def test_code_server_serves_and_the_sensor_command_stops_the_supervisor(
        services: dict[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = Path(sys.executable).parent
    port = str(_free_port())
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(sqlite_storage().instance_yaml())
    workspace = tmp_path / "workspace.yaml"
    spec = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())
    spec["load_from"][0]["grpc_server"].update(host="127.0.0.1", port=int(port))
    workspace.write_text(yaml.safe_dump(spec))
    env = e2e_env(DAGSTER_HOME=str(home))  # the definitions load on the shipped demo configuration

    def on_this_host(argv: list[str]) -> list[str]:
        """The compose command with this host's port, address and workspace file."""
        for option, value in (("-p", port), ("-h", "127.0.0.1"), ("-w", str(workspace))):
            if option in argv:
                at = argv.index(option)
                argv = [*argv[:at + 1], value, *argv[at + 2:]]
        return [str(bindir / argv[0]), *argv[1:]]

    server = on_this_host(services["code-server"]["command"])
    health = on_this_host(services["code-server"]["healthcheck"]["test"][1:])
    log = tmp_path / "code-server.log"
    with _running(server, env, log) as process:
        _poll(lambda: subprocess.run(health, env=env, capture_output=True, timeout=60).returncode == 0,
              START_DEADLINE_S, "healthy code server", process, log)
        stop = on_this_host(services["ingest-supervisor-off"]["command"])
        for attempt in (1, 2):  # idempotent: a restart of the deployment runs it again
            done = subprocess.run(stop, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"attempt {attempt}: {done.stdout}\n{done.stderr}"
            assert "Stopped sensor ingest_supervisor" in done.stdout
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # what the instance's `env:` base_dir reads
    with dg.DagsterInstance.from_config(str(home)) as instance:
        states = {s.name: s.status.value for s in instance.all_instigator_state()}
    assert states.get("ingest_supervisor") == "STOPPED", states
