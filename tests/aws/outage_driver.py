"""Test driver: `snapshotter run --once`, with the S3 endpoint (a moto_server) frozen at a chosen request.

    python -m tests.aws.outage_driver --pid MOTO_PID --match URL_PART --outage SECONDS --config FILE

Before the run, a botocore `before-send` hook is registered on the session of the `archive`
credentials profile (the same process-wide session the pipeline's S3 clients are made from). The
first PUT whose (decoded) URL contains URL_PART stops the moto_server process (SIGSTOP) and arranges its
SIGCONT after SECONDS: the request and everything after it meet an endpoint that accepts
connections but never answers, exactly as during a network or service outage. The process exits
with the command's status, after the endpoint is thawed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import urllib.parse
from typing import Any


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--match", required=True)
    parser.add_argument("--outage", type=float, required=True)
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)

    from resources.aws_credentials import CredentialProfiles
    from snapshot_assets.cli import main as snapshotter
    from snapshot_assets.config import load_config

    fired = threading.Event()

    def freeze(request: Any, **_: Any) -> None:
        if request.method == "PUT" and args.match in urllib.parse.unquote(request.url) and not fired.is_set():
            fired.set()
            print(f"outage: freezing the endpoint at {request.url} for {args.outage:.0f} s", file=sys.stderr)
            os.kill(args.pid, signal.SIGSTOP)
            threading.Timer(args.outage, os.kill, (args.pid, signal.SIGCONT)).start()

    profiles = CredentialProfiles.shared(load_config(args.config).credentials)
    profiles.session("archive").events.register("before-send.s3", freeze)
    status = snapshotter(["run", "--once", "--config", args.config])
    print(f"outage fired: {fired.is_set()}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
