"""`snapshotter serve`: laredo-snapshotter's operational HTTP API, for probes and automation written for it.

  GET  /health/live   200 `{"status":"ok"}` while the process is up (laredo's body).
  GET  /health/ready  200 once every table has a committed snapshot and a live ingest, else 503;
                      `{"ready": bool, "tables": [{"table", "ready", "not_ready": [why, ...]}]}`
                      (laredo answers `{"ready": bool}`; the per-table reasons are added).
  GET  /status        a JSON array, one object per table: laredo's `Status` fields first (`table`,
                      `epoch`, `head_position`, `buffer_depth`, `churn_records`, `last_snapshot_at`),
                      then `position` (the buffer's durable position) and everything
                      `snapshotter status --output json` reports, under its own names.
  GET  /metrics       Prometheus text (metrics.py), plus the process collector as laredo's has.
  GET  /bootstrap/<table>?position=P&expires=3600
                      what brings a replica at P (none: a new one) to the head, as URLs it GETs without
                      credentials (bootstrap.py): 200 with the answer, 400 for a bad position or
                      expires, 404 for a table that is not configured or has no archive yet.
  POST /snapshot      a `force_snapshot` run per table (all, or `?table=schema.table`) submitted to
                      the Dagster instance (launch.py), pinned as `?label=` when given; 200
                      `{"runs": [{"table", "run_id"}]}`, 404 for a table that is not configured,
                      503 when no instance is configured.
                      laredo snapshots synchronously; here the run is queued and the daemon runs
                      it (one writer per table), so the answer names the runs to follow instead.

Status, readiness and metrics are one collection (metrics.StatusCollector, refreshed every
`interval` in the background): they cannot disagree, and no request waits on a slow destination.
`collected_at` in each table's status says how fresh it is.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from resources import stop_signals
from resources.destinations.base import DestinationError
from snapshot_assets.archive.errors import ArchiveError, ManifestNotFound, PositionError
from snapshot_assets.bootstrap import BootstrapError, Bootstrapper, UnknownTable
from snapshot_assets.launch import FORCE_SNAPSHOT_JOB, SubmitRun, force_snapshot_run
from snapshot_assets.metrics import StatusCollector
from snapshot_assets.redaction import redact
from snapshot_assets.status import TableStatus

log = logging.getLogger(__name__)

BOOTSTRAP_ROUTE = "/bootstrap/"


def laredo_status(status: TableStatus, collected_at: float) -> dict[str, Any]:
    """One table's `/status` object: laredo's field names first, then this project's status."""
    out: dict[str, Any] = {
        "table": status.table,
        "epoch": status.epoch,
        "head_position": status.head_position,
        "buffer_depth": status.buffered_changes,
        "churn_records": status.churn_since_snapshot,
        "last_snapshot_at": status.last_snapshot_at,
        "position": status.durable_position,
    }
    out.update({k: v for k, v in status.to_json().items() if k not in out})
    out["collected_at"] = _dt.datetime.fromtimestamp(collected_at, _dt.UTC).isoformat().replace("+00:00", "Z") \
        if collected_at else None
    return out


def readiness(statuses: Sequence[TableStatus], collected_at: float) -> tuple[bool, dict[str, Any]]:
    if not collected_at:
        return False, {"ready": False, "tables": [], "not_ready": ["the table status has not been collected yet"]}
    tables = [{"table": s.table, "ready": s.ready, "not_ready": s.not_ready} for s in statuses]
    ready = all(s.ready for s in statuses)
    return ready, {"ready": ready, "tables": tables}


class Api:
    """The routes, over a status collector and (optionally) a way to submit runs."""

    def __init__(self, collector: StatusCollector, tables: Sequence[str], submit: SubmitRun | None,
                 no_submit_reason: str = "", bootstrap: Bootstrapper | None = None) -> None:
        self.collector, self.tables = collector, list(tables)
        self.submit, self.no_submit_reason = submit, no_submit_reason
        self.bootstrapper = bootstrap
        self.registry = collector.registry()

    def get(self, path: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        if path == "/health/live":
            return _json(HTTPStatus.OK, {"status": "ok"})
        if path == "/health/ready":
            ready, body = readiness(*self.collector.latest())
            return _json(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, body)
        if path == "/status":
            statuses, collected_at = self.collector.latest()
            return _json(HTTPStatus.OK, [laredo_status(s, collected_at) for s in statuses])
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            return HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/snapshot":
            return _json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "use POST"})
        if path.startswith(BOOTSTRAP_ROUTE) and self.bootstrapper is not None:
            return self.bootstrap(urllib.parse.unquote(path[len(BOOTSTRAP_ROUTE):]), query)
        return _not_found(path)

    def bootstrap(self, table: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        """`GET /bootstrap/<table>`: the answer, or the one-line reason it cannot be given."""
        assert self.bootstrapper is not None
        one = {k: v[-1] for k, v in query.items() if v}
        try:
            return _json(HTTPStatus.OK, self.bootstrapper.answer(table, one.get("position"), one.get("expires"),
                                                                 one.get("destination")))
        except (UnknownTable, ManifestNotFound) as e:
            return _json(HTTPStatus.NOT_FOUND, {"error": redact(str(e))})
        except (BootstrapError, PositionError) as e:
            return _json(HTTPStatus.BAD_REQUEST, {"error": redact(str(e))})
        except (ArchiveError, DestinationError) as e:
            log.exception("bootstrap of %s failed", table)
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": redact(f"{type(e).__name__}: {e}")})

    def post(self, path: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        if path != "/snapshot":
            return _json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{path} does not take POST"}) \
                if path in ("/health/live", "/health/ready", "/status", "/metrics") else _not_found(path)
        chosen = query.get("table") or self.tables
        unknown = [t for t in chosen if t not in self.tables]
        if unknown:
            return _json(HTTPStatus.NOT_FOUND, {"error": f"unknown table {unknown[0]!r}: the configured tables "
                                                         f"are {', '.join(self.tables)}"})
        if self.submit is None:
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": self.no_submit_reason})
        label = (query.get("label") or [""])[0].strip()
        runs: list[dict[str, str]] = []
        for table in chosen:
            try:
                run_id = self.submit(*force_snapshot_run(table, label))
            except Exception as e:  # the instance or the code location: say which table, keep the runs made
                log.exception("launching %s for %s failed", FORCE_SNAPSHOT_JOB, table)
                return _json(HTTPStatus.SERVICE_UNAVAILABLE, {
                    "error": redact(f"launching {FORCE_SNAPSHOT_JOB} for {table} failed: {type(e).__name__}: {e}"),
                    "runs": runs})
            log.info("launched %s for %s: run %s", FORCE_SNAPSHOT_JOB, table, run_id)
            runs.append({"table": table, "run_id": run_id})
        return _json(HTTPStatus.OK, {"runs": runs})


def _json(code: int, body: Any) -> tuple[int, str, bytes]:
    return code, "application/json", (json.dumps(body) + "\n").encode()


def _not_found(path: str) -> tuple[int, str, bytes]:
    return _json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path} (see /health/live, /health/ready, "
                                                 "/status, /metrics, /bootstrap/<table>, POST /snapshot)"})


def _handler(api: Api) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "snapshotter"

        def _answer(self, route: Callable[[str, dict[str, list[str]]], tuple[int, str, bytes]]) -> None:
            url = urllib.parse.urlsplit(self.path)
            code, kind, body = route(url.path.rstrip("/") or "/", urllib.parse.parse_qs(url.query))
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(api.get)

        def do_POST(self) -> None:
            self._answer(api.post)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return Handler


def serve(collect: Callable[[], Sequence[TableStatus]], *, tables: Sequence[str], port: int,
          addr: str = "0.0.0.0", interval: float = 5.0, submit: SubmitRun | None = None,
          no_submit_reason: str = "", stop: threading.Event | None = None,
          on_listening: Callable[[int], None] | None = None, bootstrap: Bootstrapper | None = None) -> None:
    """Serve the API on `addr:port` until `stop` is set (or forever). `on_listening(port)` is told
    the bound port (useful with port 0)."""
    collector = StatusCollector(collect, interval)
    api = Api(collector, tables, submit, no_submit_reason, bootstrap)
    server = ThreadingHTTPServer((addr, port), _handler(api))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="snapshotter-http", daemon=True)
    thread.start()
    collector.start()
    bound = int(server.server_address[1])
    log.info("serving the snapshotter API on http://%s:%d (/health/live, /health/ready, /status, /metrics, "
             "POST /snapshot)", addr, bound)
    if on_listening is not None:
        on_listening(bound)
    try:
        stop_signals.wait_for(stop or threading.Event())
    finally:
        collector.stop()
        server.shutdown()
        server.server_close()
        thread.join()
