"""`snapshotter`: the command line of the archive (read side: reconstruct, inspect, verify).

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
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

import dagster as dg

from resources.aws_credentials import CredentialProfiles
from resources.destinations.base import Destination, DestinationError
from resources.destinations.factory import build_destination, location_spec
from resources.subscribers.tls import ServerTls, TlsError
from snapshot_assets.archive.errors import ArchiveError, MissingKeyField
from snapshot_assets.archive.gojson import marshal
from snapshot_assets.archive.inspect import render_manifest
from snapshot_assets.archive.positions import COMPARATORS, comparator
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.verify import verify_archive
from snapshot_assets.config import load_config
from snapshot_assets.redaction import install_log_redaction, redact

if TYPE_CHECKING:
    from resources.capture.settings import CaptureSettings
    from snapshot_assets.pipeline.table import TablePipeline


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

    ins = sub.add_parser("inspect", help="print the manifest as a readable table")
    _add_store_flags(ins)

    ver = sub.add_parser("verify", help="check the chain and every object of every format")
    _add_store_flags(ver)
    ver.add_argument("--deep", action="store_true", help="also decode every artifact and compare counts")

    ing = sub.add_parser("ingest", help="run the subscribers into the change buffer until stopped")
    ing.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    ing.add_argument("--table", action="append", default=[], help="only this table (repeatable)")

    once = sub.add_parser("run", help="catch every configured table up to the source position seen at start")
    once.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    once.add_argument("--once", action="store_true", required=True,
                      help="run one catch-up pass and exit (the continuous mode is `dagster dev` / the daemon)")
    once.add_argument("--table", action="append", default=[], help="only this table (repeatable)")
    once.add_argument("--force-snapshot", action="store_true", help="start with a snapshot whatever the policy says")
    once.add_argument("--no-ingest", action="store_true", help="only archive what the buffer already holds")

    demo = sub.add_parser("demo", help="the whole pipeline on embedded defaults (generator, local archive, Spark)")
    demo.add_argument("--dir", default=".snapshotter", help="the demo's working directory (recreated)")
    demo.add_argument("--cycles", type=int, default=5)
    demo.add_argument("--changes-per-cycle", type=int, default=3000)

    st = sub.add_parser("status", help="per table: epoch, head, source lag, buffer, trigger, outbox, health")
    st.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    st.add_argument("--output", choices=("table", "json"), default="table")
    st.add_argument("--table", action="append", default=[], help="only this table (repeatable)")

    met = sub.add_parser("serve-metrics", help="serve Prometheus metrics of every configured table")
    met.add_argument("--config", help="configuration file (default: $SNAPSHOTTER_CONFIG or the demo config)")
    met.add_argument("--host", default="0.0.0.0")
    met.add_argument("--port", type=int, default=9464)
    met.add_argument("--interval", type=float, default=15.0, help="seconds between status collections")

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
    return parser


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
    stop = threading.Event()
    install_stop_signals(stop)
    outcomes = run_ingest_service(load_config(args.config), args.table, stop=stop)
    for o in outcomes:
        state = f"failed: {o.error}" if o.error else f"stopped at {o.result.durable_position if o.result else '-'}"
        out.write(f"{o.table}: {state}\n")
    return 1 if any(o.error for o in outcomes) else 0


def _use_config(path: str | None) -> None:
    """Point the code location at `path` before Dagster definitions are loaded."""
    if path:
        os.environ["SNAPSHOTTER_CONFIG"] = os.path.abspath(path)


def dagster_instance() -> dg.DagsterInstance:
    """The persistent instance when DAGSTER_HOME is set (runs show in `dagster dev`), else an ephemeral one."""
    return dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.run_once import run_once

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    _use_config(args.config)
    config = load_config(args.config)
    for outcome in run_once(config, args.table, instance=dagster_instance(), force=args.force_snapshot,
                            ingest=not args.no_ingest):
        wrote = ", ".join(outcome.artifacts) or "nothing new"
        out.write(f"{outcome.table}: buffer at {outcome.ingested_to}, head {outcome.head or '-'}; wrote {wrote}\n")
    return 0


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    from pathlib import Path

    from snapshot_assets.demo import run_demo

    logging.basicConfig(level=logging.WARNING)
    return run_demo(out, workdir=Path(args.dir).resolve(), cycles=args.cycles, per_cycle=args.changes_per_cycle)


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


def cmd_serve_metrics(args: argparse.Namespace, out: TextIO) -> int:
    from snapshot_assets.metrics import serve
    from snapshot_assets.services import install_stop_signals
    from snapshot_assets.status import dagster_home_instance, statuses

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args.table = []
    pipes = _pipelines(args)
    instance = dagster_home_instance()
    stop = threading.Event()
    install_stop_signals(stop)
    serve(lambda: statuses(pipes, instance=instance), port=args.port, addr=args.host, interval=args.interval,
          stop=stop)
    return 0


def _capture_settings(args: argparse.Namespace) -> tuple[CaptureSettings, CredentialProfiles]:
    """The capture block and the profiles its destination's `credentials` may name."""
    config = load_config(args.config)
    if config.capture is None:
        raise CliError(f"{config.file} has no capture block")
    return config.capture, CredentialProfiles.shared(config.credentials)


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
    stop.wait()
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
            "fanout-serve": cmd_fanout_serve, "run": cmd_run, "demo": cmd_demo, "status": cmd_status,
            "serve-metrics": cmd_serve_metrics, "capture-serve": cmd_capture_serve, "replay": cmd_replay}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    install_log_redaction()
    args = build_parser().parse_args(argv)
    stream = out or sys.stdout
    try:
        return COMMANDS[args.command](args, stream)
    except (CliError, ArchiveError, DestinationError, ValueError, LookupError, RuntimeError, TimeoutError) as e:
        print(f"snapshotter {args.command}: {redact(str(e))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
