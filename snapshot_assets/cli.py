"""`snapshotter`: the command line of the archive (read side: reconstruct, get, inspect, verify).

Flags follow laredo's `archive reconstruct` so scripts written for it keep working. Every failure
an operator can meet (no manifest, a newer manifest, a position the archive cannot reach, a
missing object) ends with exit status 1 and one line on stderr naming it, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from resources import stop_signals
from resources.aws_credentials import CredentialProfiles
from resources.destinations.base import Destination, DestinationError
from resources.destinations.factory import build_destination, location_spec
from resources.subscribers.tls import ServerTls, TlsError
from snapshot_assets.archive.errors import ArchiveError, MissingKeyField
from snapshot_assets.archive.gojson import marshal
from snapshot_assets.archive.inspect import render_manifest
from snapshot_assets.archive.keys import default_key_prefix
from snapshot_assets.archive.positions import COMPARATORS, comparator
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.verify import verify_archive
from snapshot_assets.config import load_config
from snapshot_assets.process_exit import skip_final_collection
from snapshot_assets.redaction import install_log_redaction, redact
from snapshot_assets.restore.run import DEFAULT_STREAM_MAX_ROWS

if TYPE_CHECKING:
    import dagster as dg

    from resources.capture.settings import CaptureSettings
    from snapshot_assets.launch import Launcher
    from snapshot_assets.pipeline.table import TablePipeline
    from snapshot_assets.spark.connect_server import ServerStatus


class CliError(Exception):
    """A failure reported as one line and exit status 1."""


def _add_store_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("archive location")
    g.add_argument("--store", choices=("local", "s3"), default="local", help="where the archive is")
    g.add_argument("--path", help="local: the destination's base directory")
    g.add_argument("--bucket", help="s3: bucket name")
    g.add_argument("--prefix", default="", help="s3: the destination's key prefix")
    g.add_argument("--region", help="s3: region")
    g.add_argument("--endpoint-url", help="s3: endpoint URL (S3-compatible stores, moto)")
    g.add_argument("--path-style", action="store_true", help="s3: path-style addressing")
    g.add_argument("--key-prefix", default="", help='the table\'s key prefix inside the destination (e.g. "users/")')
    g.add_argument("--positions", choices=sorted(COMPARATORS), default="lsn",
                   help="how positions are ordered (PostgreSQL LSNs by default)")


def _add_workspace_flags(p: argparse.ArgumentParser, why: str) -> None:
    g = p.add_argument_group("Dagster", f"{why} to the instance of $DAGSTER_HOME, for the daemon to run")
    g.add_argument("--workspace", default="workspace.yaml",
                   help="the workspace file naming the code location (default: workspace.yaml)")
    g.add_argument("--location", help="the code location in it (default: its only one)")


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--verbose", action="store_true",
                   help="print Dagster's event log and the log records to the terminal instead of a file")
    g.add_argument("--log-file", help="write the event log here (default: run: a new file under "
                                      ".snapshotter/logs; demo: events.log in its --dir)")


def _log_path(args: argparse.Namespace, default: Callable[[], Path]) -> Path | None:
    """Where the command's event log goes: --log-file, else `default()`; None (the terminal) with --verbose."""
    if args.verbose:
        return None
    return Path(args.log_file).absolute() if args.log_file else default()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snapshotter", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    rec = sub.add_parser("reconstruct", help="rebuild the table at a position from the archive")
    _add_store_flags(rec)
    rec.add_argument("--format", choices=("jsonl", "protobuf", "parquet"),
                     help="format to read (default: the first the manifest offers)")
    rec.add_argument("--key-fields", default="id",
                     help="comma-separated key columns the rows are folded by (default: laredo's id)")
    rec.add_argument("--at", help="source position to rebuild at (default: the head)")
    rec.add_argument("--output", choices=("json", "jsonl"), default="json")
    grp = rec.add_argument_group("co-refresh group", "rebuild every member of a configured group at one cut "
                                 "(the newest at or before --at) instead of one table")
    grp.add_argument("--group", help="the group's name (its tables and destinations come from --config)")
    grp.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")

    cut = sub.add_parser("cut", help="bring every member of a group to its next cut and publish the cut")
    cut.add_argument("--group", required=True, help="the group's name")
    cut.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")

    res = sub.add_parser("restore", help="write the table as of a pinned snapshot or a position into PostgreSQL")
    res.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    res.add_argument("--table", required=True, help="the configured table whose archive is read")
    point = res.add_mutually_exclusive_group(required=True)
    point.add_argument("--label", help="the label of a pinned snapshot")
    point.add_argument("--at", help="a source position: the table as of it")
    res.add_argument("--into", required=True, help="the target database (libpq DSN, e.g. postgresql://...)")
    res.add_argument("--target-table", help="[schema.]name to create (default: the archived table's name)")
    res.add_argument("--replace", action="store_true", help="swap the restored table in place of an existing one")
    res.add_argument("--stream-max-rows", type=int, default=DEFAULT_STREAM_MAX_ROWS,
                     help="restore in one process up to this many rows (the manifest's counts), with Spark "
                          "above (default: %(default)s)")

    get = sub.add_parser("get", help="one row as of a position, read without rebuilding the table")
    _add_store_flags(get)
    get.add_argument("--table", help="the table (schema.table): its default key prefix when --key-prefix is not given")
    get.add_argument("--key", action="append", required=True,
                     help="the key value; repeat once per key field, in --key-fields order")
    get.add_argument("--key-fields", help="comma-separated key columns (default: the manifest's primary key, else id)")
    get.add_argument("--at", help="source position to read at (default: the head)")
    get.add_argument("--verbose", action="store_true", help="also say on stderr how the row was found and the bytes "
                                                            "read (index, ranges, scans, diffs)")

    ins = sub.add_parser("inspect", help="print the manifest as a readable table")
    _add_store_flags(ins)

    ver = sub.add_parser("verify", help="check the chain and every object of every format")
    _add_store_flags(ver)
    ver.add_argument("--deep", action="store_true", help="also decode every artifact and compare counts")

    ing = sub.add_parser("ingest", help="run the subscribers into the change buffer until stopped")
    ing.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    ing.add_argument("--table", action="append", default=[], help="only this table (repeatable)")
    _add_workspace_flags(ing, "on SIGTERM/SIGINT, once the buffers are sealed, the final diff runs are submitted")

    once = sub.add_parser("run", help="catch every configured table up to the source position seen at start")
    once.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    once.add_argument("--once", action="store_true", required=True,
                      help="run one catch-up pass and exit (the continuous mode is `dagster dev` / the daemon)")
    once.add_argument("--table", action="append", default=[], help="only this table (repeatable)")
    once.add_argument("--force-snapshot", action="store_true", help="start with a snapshot whatever the policy says")
    once.add_argument("--no-ingest", action="store_true", help="only archive what the buffer already holds")
    _add_output_flags(once)

    demo = sub.add_parser("demo", help="the whole pipeline on embedded defaults (generator, local archive, Spark)")
    demo.add_argument("--dir", default=".snapshotter", help="the demo's working directory (recreated)")
    demo.add_argument("--cycles", type=int, default=5)
    demo.add_argument("--changes-per-cycle", type=int, default=3000)
    _add_output_flags(demo)

    spk = sub.add_parser("spark", help="the local Spark Connect server of this directory: status, stop")
    spk.add_argument("action", choices=("status", "stop"))
    spk.add_argument("--state-dir", help="the server's state directory (default: the one runs started in this "
                                         "directory use)")

    st = sub.add_parser("status", help="per table: epoch, head, source lag, buffer, trigger, outbox, health")
    st.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    st.add_argument("--output", choices=("table", "json"), default="table")
    st.add_argument("--table", action="append", default=[], help="only this table (repeatable)")

    for name, port, interval, text in (
            ("serve", 8080, 5.0, "laredo's HTTP API: /health/live, /health/ready, /status, /metrics, "
                                 "/bootstrap/<table>, POST /snapshot"),
            ("serve-metrics", 9464, 15.0, "the same HTTP API as `serve` (the former metrics-only exporter's "
                                          "name and port)")):
        srv = sub.add_parser(name, help=text)
        srv.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
        srv.add_argument("--host", default="0.0.0.0")
        srv.add_argument("--port", type=int, default=port)
        srv.add_argument("--interval", type=float, default=interval, help="seconds between status collections")
        _add_workspace_flags(srv, "POST /snapshot submits force_snapshot runs")

    fan = sub.add_parser("fanout-serve", help="serve a configured table over the laredo fan-out protocol")
    fan.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    fan.add_argument("--table", help="the table to serve (default: the only configured table)")
    fan.add_argument("--host", default="0.0.0.0")
    fan.add_argument("--port", type=int, default=4002, help="Connect protocol over HTTP/1.1 (0: off)")
    fan.add_argument("--grpc-port", type=int, default=0, help="also serve gRPC over HTTP/2 on this port")
    fan.add_argument("--journal-size", type=int, default=10_000)
    fan.add_argument("--tls-cert", help="serve over TLS with this certificate (PEM; with --tls-key)")
    fan.add_argument("--tls-key", help="the private key of --tls-cert (PEM)")
    fan.add_argument("--tls-client-ca", help="mutual TLS: require client certificates signed by this CA (PEM)")
    cap = sub.add_parser("capture-serve", help="serve event capture (RFC-023 Publish) from the config's capture block")
    cap.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    cap.add_argument("--host", default="0.0.0.0")
    cap.add_argument("--port", type=int, help="gRPC port (default: capture.port)")
    cap.add_argument("--http-port", type=int, help="also serve /health/* and /metrics on this port")

    rep = sub.add_parser("replay", help="print a capture writer's events in order (NDJSON, payload base64)")
    rep.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    rep.add_argument("--writer", required=True, help="the writer id (the topic it published to)")
    rep.add_argument("--from", dest="start", help="first time (unix milliseconds or ISO-8601)")
    rep.add_argument("--to", dest="end", help="last time (unix milliseconds or ISO-8601)")
    _add_restore_point_parsers(sub)
    return parser


def _add_restore_point_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """bootstrap (URLs by position), snapshot (a forced, labelled snapshot run), pin, unpin."""
    boot = sub.add_parser("bootstrap", help="the artifacts that bring a replica at a position to the head, as URLs")
    boot.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    boot.add_argument("--table", required=True)
    boot.add_argument("--position", help="the last position the replica applied (default: a new replica)")
    boot.add_argument("--expires", default="1h", help="how long the URLs stay valid (1s to 7d; default 1h)")
    boot.add_argument("--destination", help="the destination whose objects the URLs name (default: the first)")

    snap = sub.add_parser("snapshot", help="submit a force_snapshot run of a table (pinned when labelled)")
    snap.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    snap.add_argument("--table", required=True)
    snap.add_argument("--label", default="", help="pin the snapshot as this restore point")
    _add_workspace_flags(snap, "the run is submitted")

    for name, text in (("pin", "pin a snapshot so retention keeps it (a restore point)"),
                       ("unpin", "remove a snapshot's pin; the next commit's retention may prune it")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
        p.add_argument("--table", required=True)
        p.add_argument("--position", required=True, help="the snapshot's position (its to_position)")
        if name == "pin":
            p.add_argument("--label", default="", help="the restore point's label (default: the position)")


def _destination(args: argparse.Namespace) -> Destination:
    if args.store == "local" and not args.path:
        raise CliError("--store local needs --path")
    if args.store == "s3" and not args.bucket:
        raise CliError("--store s3 needs --bucket")
    return build_destination(location_spec(
        args.store, path=args.path, bucket=args.bucket, prefix=args.prefix, region=args.region,
        endpoint_url=args.endpoint_url, path_style=args.path_style))


def _reader(args: argparse.Namespace, **kw: object) -> ArchiveReader:
    return ArchiveReader(_destination(args), args.key_prefix, cmp=comparator(args.positions), **kw)  # type: ignore[arg-type]


def cmd_reconstruct(args: argparse.Namespace, out: TextIO) -> int:
    if args.group:
        return _reconstruct_group(args, out)
    key_fields = [f.strip() for f in args.key_fields.split(",") if f.strip()]
    if not key_fields:
        raise CliError("--key-fields names no column")
    reader = _reader(args, formats=[args.format] if args.format else None, key_fields=key_fields)
    manifest = reader.load_manifest()
    try:
        rec = reader.reconstruct_as_of(args.at, manifest)
    except MissingKeyField as e:
        raise CliError(f"{e}: pass the table's key columns with --key-fields") from None
    if rec is None:
        first = next(manifest.snapshots(), None)
        reach = f"its first snapshot is at {first.to_position}" if first else "it holds no snapshot"
        raise CliError(f"the archive cannot reach position {args.at or manifest.head_position}: {reach}")
    if args.output == "jsonl":
        for row in rec.rows:
            out.write(marshal(row).decode() + "\n")
    else:
        # {"position", "row_count", "rows"} in that order; rows streamed one at a time, keys sorted as Go does.
        out.write(f'{{"position":{marshal(rec.position).decode()},"row_count":{len(rec.rows)},"rows":[')
        for i, row in enumerate(rec.rows):
            out.write(("," if i else "") + marshal(row).decode())
        out.write("]}\n")
    return 0


def cmd_restore(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.pipeline.table import TablePipeline
    from snapshot_assets.restore.run import restore_table, spark_from_config

    config = load_config(args.config)
    try:
        table = config.table(args.table)
    except KeyError as e:
        raise CliError(str(e.args[0])) from None
    pipe = TablePipeline(table)
    result = restore_table(pipe.destinations[0], table.key_prefix, into=args.into, label=args.label,
                           position=args.at, target_table=args.target_table, replace=args.replace,
                           stream_max_rows=args.stream_max_rows,
                           spark=spark_from_config(config.spark), cmp=pipe.cmp, fallback_key=table.key_fields)
    out.write(result.describe() + "\n")
    return 0


def _reconstruct_group(args: argparse.Namespace, out: TextIO) -> int:
    """`reconstruct --group G`: {"group", "position" (the cut), "tables": {name: {"position", "row_count",
    "rows"}}} as one JSON document, or with --output jsonl one line per row with its table."""
    from snapshot_assets.groups.read import read_group

    got = read_group(load_config(args.config), args.group, args.at)
    if args.output == "jsonl":
        for table, rec in got.tables.items():
            for row in rec.rows:
                out.write(marshal({"table": table, "row": row}).decode() + "\n")
        return 0
    out.write(f'{{"group":{marshal(args.group).decode()},"position":{marshal(got.cut.position).decode()},"tables":{{')
    for i, (table, rec) in enumerate(got.tables.items()):
        rows = ",".join(marshal(row).decode() for row in rec.rows)
        out.write(f'{"," if i else ""}{marshal(table).decode()}:{{"position":{marshal(rec.position).decode()},'
                  f'"row_count":{len(rec.rows)},"rows":[{rows}]}}')
    out.write("}}\n")
    return 0


def cmd_cut(args: argparse.Namespace, out: TextIO) -> int:
    """One group tick outside Dagster (the group_cut sensor's job does the same)."""
    from snapshot_assets.groups.cut import GroupPipeline
    from snapshot_assets.spark.session import open_spark

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = load_config(args.config)
    group = GroupPipeline.of(config, args.group)
    runtime = open_spark(config.spark)
    try:
        outcome = group.advance(runtime.spark)
    finally:
        runtime.stop()
    wrote = ", ".join(f"{t} {a.describe()}" for t, a in outcome.committed) or "nothing"
    if outcome.cut is None:
        out.write(f"{args.group}: no cut ({outcome.reason}); wrote {wrote}\n")
    else:
        out.write(f"{args.group}: cut at {outcome.cut.position}; wrote {wrote}\n")
    return 0


def cmd_get(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.archive import lookup

    fields = [f.strip() for f in (args.key_fields or "").split(",") if f.strip()] or None
    prefix = args.key_prefix or (default_key_prefix(args.table) if args.table else "")
    try:
        result = lookup.get(_destination(args), prefix, args.key, key_fields=fields, at=args.at,
                            cmp=comparator(args.positions))
    except MissingKeyField as e:
        raise CliError(f"{e}: pass the table's key columns with --key-fields") from None
    out.write(marshal(lookup.describe(result)).decode() + "\n")
    if args.verbose:
        print(lookup.explain(result), file=sys.stderr)
    return 0


def cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    out.write(render_manifest(_reader(args).load_manifest()))
    return 0


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    reader = _reader(args)
    problems = verify_archive(reader, deep=args.deep)
    for problem in problems:
        out.write(f"PROBLEM: {problem}\n")
    if problems:
        out.write(f"{len(problems)} problem(s) found\n")
        return 1
    out.write("ok: chain contiguous, every object present in every format, sizes match\n")
    return 0


def cmd_ingest(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.services import install_stop_signals, run_ingest_service

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    _use_config(args.config)  # the code location loaded for the final runs reads the same tables
    stop = threading.Event()
    install_stop_signals(stop)
    outcomes = run_ingest_service(load_config(args.config), args.table, stop=stop)
    finals = _final_artifacts(args, [o.table for o in outcomes])
    for o in outcomes:
        state = f"failed: {o.error}" if o.error else f"stopped at {o.result.durable_position if o.result else '-'}"
        out.write(f"{o.table}: {state}; {finals.get(o.table, '')}\n")
    return 1 if any(o.error for o in outcomes) else 0


def _final_artifacts(args: argparse.Namespace, tables: Sequence[str]) -> dict[str, str]:
    """Graceful shutdown: the final diff of every table with buffered changes, submitted to the
    $DAGSTER_HOME instance (snapshot_assets/shutdown.py); per table, what was done."""
    from snapshot_assets.pipeline.table import TablePipeline
    from snapshot_assets.shutdown import request_final_artifacts
    from snapshot_assets.status import dagster_home_instance

    launch, why = launcher(args, dagster_home_instance())
    if launch is None:
        return dict.fromkeys(tables, f"no final diff requested ({why}): the trigger sensor or "
                                     "`snapshotter run --once --no-ingest` archives the sealed changes")
    config = load_config(args.config)
    with launch:
        done = request_final_artifacts([TablePipeline(config.table(t)) for t in tables], launch.instance,
                                       launch.submit)
    return {r.table: r.detail for r in done}


def _use_config(path: str | None) -> None:
    """Point the code location at `path` before Dagster definitions are loaded."""
    if path:
        os.environ["SNAPSHOTTER_CONFIG"] = os.path.abspath(path)


def dagster_instance() -> dg.DagsterInstance:
    """The persistent instance when DAGSTER_HOME is set (runs show in `dagster dev`), else an ephemeral one."""
    import dagster as dg

    return dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.run_once import run_once
    from snapshot_assets.run_output import DEFAULT_LOG_DIR, command_output, default_log_path

    _use_config(args.config)
    config = load_config(args.config)
    with command_output(out, _log_path(args, lambda: default_log_path(DEFAULT_LOG_DIR.absolute(), "run-once"))) \
            as output:
        for outcome in run_once(config, args.table, instance=dagster_instance, force=args.force_snapshot,
                                ingest=not args.no_ingest, output=output):
            wrote = ", ".join(outcome.artifacts) or "nothing new"
            output.view.line(f"{outcome.table}: buffer at {outcome.ingested_to}, head {outcome.head or '-'}; "
                             f"wrote {wrote}")
    return 0


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.demo import run_demo

    workdir = Path(args.dir).resolve()
    return run_demo(out, workdir=workdir, cycles=args.cycles, per_cycle=args.changes_per_cycle,
                    log_path=_log_path(args, lambda: workdir / "events.log"))


def cmd_spark(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.spark.connect_server import (
        DEFAULT_STATE_DIR,
        last_stop,
        server_status,
        stop_local_connect_server,
    )

    state_dir = args.state_dir or DEFAULT_STATE_DIR
    status = server_status(state_dir)
    if args.action == "stop":
        stopped = stop_local_connect_server(state_dir)
        out.write(f"stopped the local Spark Connect server (pid {status.info.pid})\n" if stopped and status
                  else "stopped the local Spark Connect server\n" if stopped
                  else f"no local Spark Connect server runs under {state_dir}\n")
        return 0
    if status is None:
        why = last_stop(state_dir)
        out.write(f"no local Spark Connect server runs under {state_dir}"
                  f"{f' (the last one stopped: {why})' if why else ''}\n")
        return 0
    out.write(render_server_status(status))
    return 0


def render_server_status(status: ServerStatus) -> str:
    """`snapshotter spark status` of a running server, one fact per line."""
    from snapshot_assets.spark.connect_server import human_duration

    info, idle = status.info, status.idle_s
    sessions = "unknown (connections cannot be counted here)" if status.sessions is None else str(status.sessions)
    idle_text = "no (in use)" if status.sessions else human_duration(idle) if idle is not None else "unknown"
    rows = [("pid", str(info.pid)), ("port", str(info.port)), ("uptime", human_duration(status.uptime_s)),
            ("sessions", sessions), ("idle", idle_text),
            ("rss", (f"{status.rss_bytes / 2**20:.0f} MiB" if status.rss_bytes else "unknown")
             + " (the JVM and its Python workers)"),
            ("memory", f"the JVM held to {info.memory_mib} MiB (spark.driver.memory + spark.driver.memoryOverhead)"
             if info.memory_mib else "the JVM's heap is Spark's default"),
            ("stops", status.stop_rule()), ("log", info.log_path)]
    return "".join(f"{name:<9}{value}\n" for name, value in rows)


def cmd_fanout_serve(args: argparse.Namespace, out: TextIO) -> int:
    from resources.subscribers.factory import build_subscriber
    from resources.subscribers.fanout_server import FanoutConfig, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = load_config(args.config)
    if args.table is None and len(config.tables) != 1:
        raise CliError("several tables are configured; choose one with --table")
    table = config.table(args.table) if args.table else config.tables[0]
    fanout = FanoutConfig(schema=table.source.schema, table=table.source.table, host=args.host,
                          port=args.port, connect=args.port > 0, grpc_port=args.grpc_port,
                          journal_size=args.journal_size, tls=_server_tls(args))
    serve(fanout, build_subscriber(table))
    return 0


def _server_tls(args: argparse.Namespace) -> ServerTls | None:
    if not (args.tls_cert or args.tls_key or args.tls_client_ca):
        return None
    try:
        return ServerTls(args.tls_cert or "", args.tls_key or "", args.tls_client_ca or "")
    except TlsError as exc:
        raise CliError(f"{exc}: pass --tls-cert and --tls-key") from None


def _pipelines(args: argparse.Namespace) -> list[TablePipeline]:
    from snapshot_assets.pipeline.table import TablePipeline

    config = load_config(args.config)
    return [TablePipeline(t) for t in ([config.table(n) for n in args.table] if args.table else config.tables)]


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.status import dagster_home_instance, render, render_json, statuses

    items = statuses(_pipelines(args), instance=dagster_home_instance())
    out.write(render_json(items) if args.output == "json" else render(items))
    return 0


def launcher(args: argparse.Namespace, instance: dg.DagsterInstance | None) -> tuple[Launcher | None, str]:
    """The run launcher of `--workspace` on `instance` (the $DAGSTER_HOME one), or why there is none."""
    from pathlib import Path

    from snapshot_assets.launch import Launcher, LaunchError, workspace_origin

    if instance is None:
        return None, "no Dagster instance: set DAGSTER_HOME to the instance the daemon uses"
    try:
        return Launcher(instance, workspace_origin(Path(args.workspace), args.location)), ""
    except LaunchError as e:
        return None, str(e)


def cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.bootstrap import Bootstrapper
    from snapshot_assets.http_api import serve
    from snapshot_assets.services import install_stop_signals
    from snapshot_assets.status import dagster_home_instance, statuses

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    _use_config(args.config)  # the code location loaded for POST /snapshot reads the same tables
    args.table = []
    pipes = _pipelines(args)
    instance = dagster_home_instance()
    launch, why = launcher(args, instance)
    if launch is None:
        logging.getLogger(__name__).warning("POST /snapshot is off: %s", why)
    stop = threading.Event()
    install_stop_signals(stop)
    try:
        serve(lambda: statuses(pipes, instance=instance), tables=[p.name for p in pipes], port=args.port,
              addr=args.host, interval=args.interval, submit=launch.submit if launch else None,
              no_submit_reason=why, stop=stop, bootstrap=Bootstrapper(pipes))
    finally:
        if launch is not None:
            launch.close()
    return 0


def _capture_settings(args: argparse.Namespace) -> tuple[CaptureSettings, CredentialProfiles]:
    """The capture block and the profiles its destination's `credentials` may name."""
    config = load_config(args.config)
    if config.capture is None:
        raise CliError(f"{config.file} has no capture block")
    return config.capture, CredentialProfiles.shared(config.credentials)


def cmd_bootstrap(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.bootstrap import Bootstrapper

    pipes = _pipelines(argparse.Namespace(config=args.config, table=[args.table]))
    body = Bootstrapper(pipes).answer(args.table, args.position, args.expires, args.destination)
    out.write(json.dumps(body, indent=2) + "\n")
    return 0


def cmd_snapshot(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.launch import force_snapshot_run
    from snapshot_assets.status import dagster_home_instance

    _use_config(args.config)  # the code location loaded for the run reads the same tables
    table = load_config(args.config).table(args.table).name
    launch, why = launcher(args, dagster_home_instance())
    if launch is None:
        raise CliError(why)
    with launch:
        run_id = launch.submit(*force_snapshot_run(table, args.label.strip()))
    pinned = f", pinned as {args.label.strip()!r}" if args.label.strip() else ""
    out.write(f"{table}: force_snapshot run {run_id} submitted{pinned}\n")
    return 0


def cmd_pin(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.restore_points import pin, unpin

    (pipe,) = _pipelines(argparse.Namespace(config=args.config, table=[args.table]))
    if args.command == "pin":
        art = pin(pipe, args.position, args.label.strip())
        out.write(f"{pipe.name}: pinned {art.describe()} as {args.label.strip() or args.position!r}\n")
    else:
        art = unpin(pipe, args.position)
        out.write(f"{pipe.name}: unpinned {art.describe()}; the next commit's retention may prune it\n")
    return 0


def cmd_capture_serve(args: argparse.Namespace, out: TextIO) -> int:
    from resources.capture.app import CaptureApp
    from snapshot_assets.services import install_stop_signals

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings, profiles = _capture_settings(args)
    app = CaptureApp(settings, profiles=profiles)
    stop = threading.Event()
    install_stop_signals(stop)
    port = app.start(args.port, args.http_port, args.host)
    print(f"capture: listening on {args.host}:{port}" + (f", http {app.http_port_bound}" if args.http_port is not None
                                                         else ""), file=out, flush=True)
    stop_signals.wait_for(stop)
    app.stop()
    return 0


def cmd_replay(args: argparse.Namespace, out: TextIO) -> int:
    from resources.capture.pages import event_json
    from resources.capture.replay import parse_time, replay

    settings, profiles = _capture_settings(args)
    start = parse_time(args.start) if args.start else None
    end = parse_time(args.end) if args.end else None
    for event in replay(settings, args.writer, start, end, profiles=profiles):
        out.write(json.dumps(event_json(event), separators=(",", ":")) + "\n")
    return 0


COMMANDS = {"reconstruct": cmd_reconstruct, "inspect": cmd_inspect, "verify": cmd_verify, "ingest": cmd_ingest,
            "restore": cmd_restore,
            "get": cmd_get,
            "fanout-serve": cmd_fanout_serve, "run": cmd_run, "demo": cmd_demo, "status": cmd_status,
            "serve": cmd_serve, "serve-metrics": cmd_serve, "spark": cmd_spark, "capture-serve": cmd_capture_serve,
            "replay": cmd_replay,
            "cut": cmd_cut}

COMMANDS.update({"bootstrap": cmd_bootstrap, "snapshot": cmd_snapshot, "pin": cmd_pin, "unpin": cmd_pin})


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    install_log_redaction()
    args = build_parser().parse_args(argv)
    stream = out or sys.stdout
    try:
        return COMMANDS[args.command](args, stream)
    except (CliError, ArchiveError, DestinationError, ValueError, LookupError, RuntimeError, TimeoutError) as e:
        print(f"snapshotter {args.command}: {redact(str(e))}", file=sys.stderr)
        return 1


def console() -> int:
    """The `snapshotter` command: `main` in a process that exits without its last collections
    (process_exit.py: a fifth of an unchanged table's forced re-base went to them)."""
    skip_final_collection()
    return main()


if __name__ == "__main__":
    sys.exit(console())
