"""The local Connect server is held to heap + overhead: sizes parsed as Spark parses them, the
growable pools capped from the overhead, the user's own JVM options left to win, and a Parquet
row group larger than the direct-buffer cap still read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from snapshot_assets.spark import connect_server
from snapshot_assets.spark.connect_server import (
    ensure_local_connect_server,
    local_server_info,
    server_command,
    stop_local_connect_server,
)
from snapshot_assets.spark.server_memory import (
    MIN_OVERHEAD_MIB,
    ON_OUT_OF_MEMORY,
    READER_SETTINGS,
    jvm_caps,
    memory_budget_mib,
    overhead_mib,
    spark_mib,
)


@pytest.mark.parametrize(("text", "mib"), [("4g", 4096), ("4G", 4096), ("1024m", 1024), ("1024mb", 1024),
                                           ("512", 512), ("2097152k", 2048), ("1t", 1 << 20)])
def test_spark_sizes_read_as_spark_reads_them(text: str, mib: int) -> None:
    assert spark_mib(text, "spark.driver.memory") == mib


@pytest.mark.parametrize("text", ["", "4 gigs", "1.5g", "-1g", "g"])
def test_a_size_spark_would_refuse_names_the_key(text: str) -> None:
    with pytest.raises(ValueError, match=r"spark.driver.memoryOverhead = .*not a Spark memory size"):
        spark_mib(text, "spark.driver.memoryOverhead")


def test_the_overhead_defaults_to_1g_and_never_falls_below_the_floors() -> None:
    assert overhead_mib({}) == 1024
    assert overhead_mib({"spark.driver.memoryOverhead": "2g"}) == 2048
    assert overhead_mib({"spark.driver.memoryOverhead": "384m"}) == MIN_OVERHEAD_MIB
    assert memory_budget_mib({"spark.driver.memory": "4g"}) == 5120
    assert memory_budget_mib({}) is None


def test_the_capped_pools_fit_the_overhead_with_room_for_the_fixed_parts() -> None:
    caps = jvm_caps(1024)
    assert caps == ["-XX:MaxDirectMemorySize=128m", "-XX:MaxMetaspaceSize=384m", "-XX:ReservedCodeCacheSize=160m"]
    # metaspace holds what the class-data archive would (68 + 189 MiB measured): its cap covers both
    metaspace = int(caps[1].split("=")[1][:-1])
    assert metaspace > 1.25 * (68 + 189)
    # GC structures, threads, arenas: 228 MiB measured beside a 2.4 GiB heap (the archive aside)
    assert sum(int(c.split("=")[1][:-1]) for c in caps) + 228 < 1024
    assert sum(int(c.split("=")[1][:-1]) for c in jvm_caps(MIN_OVERHEAD_MIB)) + 228 < MIN_OVERHEAD_MIB


def test_the_server_command_carries_the_caps_before_the_users_own_options() -> None:
    cmd = server_command(15999, {"spark.driver.memory": "2g", "spark.driver.memoryOverhead": "2g",
                                 "spark.driver.extraJavaOptions": "-XX:MaxDirectMemorySize=1g"},
                         java_option="-XX:SharedArchiveFile=x.jsa", shared_workers=True)
    options = next(c for c in cmd if c.startswith("spark.driver.extraJavaOptions=")).split("=", 1)[1].split()
    assert options == [*jvm_caps(2048), ON_OUT_OF_MEMORY, "-XX:MaxDirectMemorySize=1g", "-XX:SharedArchiveFile=x.jsa"]
    assert cmd[cmd.index("--driver-memory") + 1] == "2g"
    assert "spark.hadoop.parquet.hadoop.vectored.io.enabled=false" in cmd
    mine = server_command(15999, {"spark.hadoop.parquet.hadoop.vectored.io.enabled": "true"})
    assert "spark.hadoop.parquet.hadoop.vectored.io.enabled=true" in mine  # the user's own setting wins


@pytest.mark.parametrize("key", ["spark.driver.memory", "spark.driver.memoryOverhead"])
def test_a_bad_memory_size_fails_before_any_server_starts(key: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def no_launch(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a server process was started")

    monkeypatch.setattr(connect_server.subprocess, "Popen", no_launch)
    with pytest.raises(ValueError, match=f"{key} = '4 gigs'"):
        ensure_local_connect_server(tmp_path, conf={"spark.driver.memory": "1g", key: "4 gigs"})
    assert local_server_info(tmp_path) is None and not (tmp_path / "server.json").exists()


#: A run in its own process: a local server held to a 768 MiB overhead (96 MiB of direct buffers)
#: reads a parquet file whose one row group holds two 56 MB binary columns back to back, one
#: contiguous 112 MB range: what a diff's delta of 10,000,000 rows asked of Parquet's reader.
_BIG_RANGE_READ = """
import json, os, sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
from snapshot_assets.config import SparkConfig
from snapshot_assets.spark.session import open_spark

state, data = Path(sys.argv[1]), Path(sys.argv[2])
blob = [os.urandom(1 << 20) for _ in range(56)]
pq.write_table(pa.table({"a": pa.array(blob, pa.binary()), "b": pa.array(blob, pa.binary())}), data / "big.parquet",
               compression="none", row_group_size=1 << 20)
config = SparkConfig(conf={"spark.driver.memory": "1g", "spark.driver.memoryOverhead": "768m"})
runtime = open_spark(config, state_dir=state)
row = runtime.spark.read.parquet(str(data)).selectExpr("sum(length(a) + length(b)) AS n").collect()[0]
runtime.stop()
print(json.dumps({"bytes": row["n"]}))
"""


@pytest.mark.slow
def test_a_row_group_larger_than_the_direct_buffer_cap_is_read(tmp_path: Path) -> None:
    """Parquet's vectored reads put a whole contiguous range of column chunks in one direct buffer;
    under the server's direct-buffer cap that allocation failed and the read hung for Parquet's 300 s
    timeout. The server reads into heap buffers instead (READER_SETTINGS)."""
    state, data = tmp_path / "spark-connect", tmp_path / "data"
    data.mkdir()
    assert READER_SETTINGS["spark.hadoop.parquet.hadoop.vectored.io.enabled"] == "false"
    try:
        done = subprocess.run([sys.executable, "-c", _BIG_RANGE_READ, str(state), str(data)], capture_output=True,
                              text=True, timeout=240, check=False)
    finally:
        stop_local_connect_server(state)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"bytes": 2 * 56 << 20}
