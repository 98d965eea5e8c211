"""Running the real product against moto_server: a two-table config (S3 only; local + S3), the
`snapshotter run --once` command in a subprocess, and the generator's model as the oracle."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resources.subscribers.generator import GeneratorSubscriber
from snapshot_assets.archive.keys import typed_key
from snapshot_assets.demo import same_rows
from tests.e2e.conftest import e2e_env

SNAPSHOTTER = str(Path(sys.executable).with_name("snapshotter"))
RUN_TIMEOUT_S = 300.0
GENERATOR: dict[str, Any] = {"seed": 5, "rows": 300}
FORMATS = "formats { snapshot = [jsonl, protobuf, parquet], diff = [jsonl, parquet] }"


@dataclass
class Location:
    """One table's S3 copy, as the reader CLI addresses it."""

    table: str
    bucket: str
    prefix: str
    key_prefix: str

    def flags(self, endpoint: str) -> list[str]:
        return ["--store", "s3", "--bucket", self.bucket, "--prefix", self.prefix, "--key-prefix", self.key_prefix,
                "--endpoint-url", endpoint, "--path-style", "--region", "us-east-1"]


@dataclass
class Product:
    work: Path
    endpoint: str
    tables: dict[str, str]  # table name -> its HOCON body (without the generator's `changes`)
    credentials: str
    cwd: Path | None = None  # where the processes run (the local Spark Connect server lives under it)
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def config_file(self) -> Path:
        return self.work / "snapshotter.conf"

    def write_config(self, changes: int) -> None:
        """The generator stops after `changes` changes: a longer run's stream extends a shorter one's."""
        generator = json.dumps({**GENERATOR, "changes": changes})
        tables = ", ".join(f"{{ source {{ type = generator, table = {name.split('.')[1]}, generator {generator} }} "
                           f"{body} }}" for name, body in self.tables.items())
        self.config_file.write_text(
            f"snapshotter {{\n  tables = [ {tables} ]\n  credentials {{ {self.credentials} }}\n"
            f"  buffer {{ path = {json.dumps(str(self.work / 'buffer'))}, seal_interval = 200ms }}\n}}\n")

    def env(self) -> dict[str, str]:
        return e2e_env(DAGSTER_HOME=str(self.work / "dagster"), **self.extra_env)

    def run_once(self, changes: int, *command: str) -> subprocess.CompletedProcess[str]:
        """`snapshotter run --once` (or `command`, given the config file last) after writing the config
        for `changes`; the finished process."""
        self.write_config(changes)
        (self.work / "dagster").mkdir(exist_ok=True)
        argv = [*command, str(self.config_file)] if command else [SNAPSHOTTER, "run", "--once", "--config",
                                                                   str(self.config_file)]
        return subprocess.run(argv, cwd=self.cwd or self.work, env=self.env(), capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, check=False)


def model(table: str, changes: int) -> GeneratorSubscriber:
    return GeneratorSubscriber(table, **GENERATOR, changes=changes)


def equals_model(rows: list[dict[str, Any]], expected: dict[Any, dict[str, Any]]) -> bool:
    got = {typed_key(r, ("id",)): r for r in rows}
    return len(got) == len(rows) and same_rows(got, expected)  # type: ignore[arg-type]
