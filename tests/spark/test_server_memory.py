"""The local Connect server is held to heap + overhead: sizes parsed as Spark parses them, the
growable pools capped from the overhead, the user's own JVM options left to win."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapshot_assets.spark import connect_server
from snapshot_assets.spark.connect_server import ensure_local_connect_server, local_server_info, server_command
from snapshot_assets.spark.server_memory import (
    MIN_OVERHEAD_MIB,
    ON_OUT_OF_MEMORY,
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


@pytest.mark.parametrize("key", ["spark.driver.memory", "spark.driver.memoryOverhead"])
def test_a_bad_memory_size_fails_before_any_server_starts(key: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def no_launch(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a server process was started")

    monkeypatch.setattr(connect_server.subprocess, "Popen", no_launch)
    with pytest.raises(ValueError, match=f"{key} = '4 gigs'"):
        ensure_local_connect_server(tmp_path, conf={"spark.driver.memory": "1g", key: "4 gigs"})
    assert local_server_info(tmp_path) is None and not (tmp_path / "server.json").exists()
