"""The memory a Connect server started by this project may use, and the JVM options that hold it there.

Spark sizes a driver as `spark.driver.memory` (the JVM heap, `-Xmx`) plus
`spark.driver.memoryOverhead` (everything else the process maps); YARN and Kubernetes size the
driver's container by that sum and kill a process that outgrows it. A local server has no container,
so nothing enforced the second half: with a 4 GiB heap the JVM's resident set reached 4.3-4.8 GiB in
the 10,000,000-row benchmark. This module gives the overhead a value and keeps the JVM inside it.

Where the memory outside the heap went (Native Memory Tracking, sampled every 3 s through the
1,000,000-row benchmark, heap at 2.4 GiB): the class-data archive 189 MiB (mapped file), GC
structures 133, JIT code 78, metaspace 68, direct buffers ("Other") 61, thread stacks 39, compiler
arenas and symbols 56: 624 MiB. The class-data archive and thread stacks are fixed; GC structures
scale with the heap, which `-Xmx` caps; three pools grow with the work and have no cap by default
(direct buffers up to the heap's size, metaspace unlimited, code cache 240 MiB). Those three get
caps here, as shares of the overhead that leave the rest of it to the fixed parts:

    direct buffers  1/8    (128 MiB of a 1 GiB overhead)
    metaspace       3/8    (384 MiB)
    code cache      5/32   (160 MiB)

each no lower than a floor under which Spark stops working well (a full code cache stops the JIT),
so an overhead set below 768 MiB is raised to the floors' needs rather than starving the JVM.

Metaspace and the class-data archive hold the same thing, the loaded classes' metadata: a class the
archive has is mapped from it, any other is built in metaspace. A server started before any archive
exists (the first on a machine, or after a JDK or Spark upgrade) holds every class in metaspace:
a cap of 3/16 (192 MiB), sized from the 68 MiB measured beside an archive, failed the 10,000,000-row
benchmark's first diff with `OutOfMemoryError: Metaspace`. So the cap covers the archive's classes
too (68 + 189 MiB, with room), and the sum of the caps still leaves the fixed parts but the archive
(GC, threads, arenas: 228 MiB) inside the overhead.

Capping direct buffers means no reader may need an unbounded one. Parquet's vectored reads (on by
default since Parquet 1.16, which Spark 4 ships) read each contiguous range of a row group's column
chunks into one direct buffer (parquet-java issue 3719): reading a 10,000,000-row diff's delta, two
tasks asked for 33 MB ranges under the 128 MiB cap, the allocation failed in Parquet's reading
thread, and the task waited out Parquet's 300 s timeout before failing the diff. The server turns
them off (`READER_SETTINGS`): Parquet then reads into heap buffers, which `-Xmx` bounds.

A JVM that runs out of memory all the same exits (`-XX:+ExitOnOutOfMemoryError`) rather than
living on with failing threads: its clients' operations fail at once with the connection, not
after a two-minute deadline, and the next run starts a fresh server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

HEAP_KEY = "spark.driver.memory"
OVERHEAD_KEY = "spark.driver.memoryOverhead"
#: The local server's overhead when `spark.conf` sets none. Spark's own default, max(384 MiB, 10% of
#: the heap), is sized for a cluster manager's container, and is less than the 624 MiB measured above.
DEFAULT_OVERHEAD = "1g"
MIN_OVERHEAD_MIB = 768

#: (JVM option, share of the overhead, floor in MiB) for each pool that grows with the work.
_CAPPED_POOLS: tuple[tuple[str, float, int], ...] = (
    ("-XX:MaxDirectMemorySize", 1 / 8, 64),
    ("-XX:MaxMetaspaceSize", 3 / 8, 256),
    ("-XX:ReservedCodeCacheSize", 5 / 32, 96),
)

#: Spark settings the caps need (see the module doc); the user's own `spark.conf` wins.
READER_SETTINGS = {"spark.hadoop.parquet.hadoop.vectored.io.enabled": "false"}

#: What the JVM does when a pool is full all the same (see the module doc).
ON_OUT_OF_MEMORY = "-XX:+ExitOnOutOfMemoryError"

_UNITS = {"": 1 << 20, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgtp]?)b?\s*$", re.IGNORECASE)


def spark_mib(text: str, key: str) -> int:
    """A Spark memory size (`4g`, `1024m`, `512`: MiB without a unit, as Spark reads these keys) in MiB.

    Not `config_values.parse_size`, the configuration's own sizes: Spark's grammar differs (a bare
    number is MiB, not bytes; `mb` is MiB, not 10^6 bytes; no fractions), and these values are Spark's."""
    match = _SIZE.match(str(text))
    if match is None:
        raise ValueError(f"{key} = {text!r}: not a Spark memory size (a whole number with k, m, g or t, e.g. 4g)")
    return max(1, int(match.group(1)) * _UNITS[match.group(2).lower()] >> 20)


def overhead_mib(conf: Mapping[str, str]) -> int:
    """The overhead the server is held to: `spark.driver.memoryOverhead`, else the default, at least
    the floors' sum."""
    return max(MIN_OVERHEAD_MIB, spark_mib(conf.get(OVERHEAD_KEY, DEFAULT_OVERHEAD), OVERHEAD_KEY))


def jvm_caps(overhead: int) -> list[str]:
    """The JVM options capping the pools that grow with the work, from an overhead in MiB."""
    return [f"{option}={max(floor, int(overhead * share))}m" for option, share, floor in _CAPPED_POOLS]


def memory_budget_mib(conf: Mapping[str, str]) -> int | None:
    """Heap plus overhead in MiB: what the server's JVM is held to (None: the heap is Spark's default)."""
    heap = conf.get(HEAP_KEY)
    return None if heap is None else spark_mib(heap, HEAP_KEY) + overhead_mib(conf)
