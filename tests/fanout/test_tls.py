"""The laredo client over TLS against the fan-out server over TLS, on Connect and gRPC (every test runs
on both): a CA made in the test, server name checks, mutual TLS, and certificate problems that end
the subscriber at once with a SourceConfigError naming the TLS problem instead of retrying forever.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from resources.subscribers.errors import SourceConfigError
from resources.subscribers.events import ChangeEvent, Event, SnapshotRow
from resources.subscribers.factory import build_subscriber
from resources.subscribers.fanout_server import FanoutConfig, FanoutServer, run_fanout_server
from resources.subscribers.laredo import LaredoSubscriber
from resources.subscribers.tls import ClientTls, ServerTls
from snapshot_assets.archive.changes import Action
from snapshot_assets.cli import main
from snapshot_assets.config import parse_config
from tests.conftest import _free_port
from tests.fanout.certs import CA
from tests.fanout.conftest import ROWS
from tests.fanout.support import Collector, ScriptedSource

Serve = Callable[..., FanoutServer]
Connect = Callable[..., Collector]


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    server_ca, client_ca, other_ca = CA(tmp_path, "server"), CA(tmp_path, "clients"), CA(tmp_path, "other")
    return {
        "server_ca": server_ca,
        "client_ca": client_ca,
        "other_ca": other_ca,
        "server": server_ca.issue("fanout", dns=("localhost",), ips=("127.0.0.1",)),
        "named": server_ca.issue("named", dns=("laredo.internal",)),
        "client": client_ca.issue("archiver", client=True),
        "stranger": other_ca.issue("stranger", client=True),
    }


@pytest.fixture
def serve(protocol: str) -> Iterator[Serve]:
    started: list[FanoutServer] = []

    def start(tls: ServerTls, source: ScriptedSource | None = None) -> FanoutServer:
        server = run_fanout_server(source or ScriptedSource(ROWS), "public", "items", protocol=protocol,
                                   ready_timeout=10, heartbeat_interval=0.2, tls=tls)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def connect(protocol: str) -> Iterator[Connect]:
    started: list[Collector] = []

    def start(url: str, tls: ClientTls) -> Collector:
        # A short backoff: were a TLS failure retried, the test would see reconnects at once.
        subscriber = LaredoSubscriber(url, "public", "items", protocol=protocol, tls=tls, heartbeat_timeout=5.0,
                                      backoff_initial=0.05, backoff_max=0.05)
        collector = Collector(subscriber)
        started.append(collector)
        return collector

    yield start
    for collector in started:
        collector.stop()


def _rows(count: int) -> Callable[[list[Event]], bool]:
    return lambda events: sum(isinstance(e, SnapshotRow) for e in events) >= count


def _tls_failure(client: Collector, *needles: str) -> str:
    """The client stopped on its own, at once, with a SourceConfigError naming the TLS problem."""
    error = client.wait_error(timeout=15.0)
    assert isinstance(error, SourceConfigError), repr(error)
    assert not error.transient and client.subscriber.stats.reconnects == 0
    message = str(error)
    assert "TLS" in message and all(n in message for n in needles), message
    return message


def test_server_verified_against_the_ca_file(pki: dict[str, Any], serve: Serve, connect: Connect,
                                             protocol: str) -> None:
    source = ScriptedSource(ROWS)
    server = serve(ServerTls(pki["server"].cert_file, pki["server"].key_file), source)
    assert server.url.startswith("https://" if protocol == "connect" else "grpcs://")
    client = connect(server.url, ClientTls(ca_file=pki["server_ca"].ca_file))
    client.wait(_rows(len(ROWS)))
    position = source.commit((Action.UPDATE, {"id": 1}, {"id": 1, "tenant": 2, "name": "over tls"}))
    events = client.wait(lambda ev: any(isinstance(e, ChangeEvent) and e.position == position for e in ev))
    change = next(e for e in events if isinstance(e, ChangeEvent) and e.position == position)
    assert change.new == {"id": 1, "tenant": 2, "name": "over tls"}


def test_server_name_verifies_a_certificate_for_another_name(pki: dict[str, Any], serve: Serve,
                                                             connect: Connect) -> None:
    server = serve(ServerTls(pki["named"].cert_file, pki["named"].key_file))
    url = server.url  # dials 127.0.0.1; the certificate is for laredo.internal only
    connect(url, ClientTls(ca_file=pki["server_ca"].ca_file, server_name="laredo.internal")).wait(_rows(len(ROWS)))
    wrong = connect(url, ClientTls(ca_file=pki["server_ca"].ca_file))
    _tls_failure(wrong, "server_name")
    other = connect(url, ClientTls(ca_file=pki["server_ca"].ca_file, server_name="elsewhere.internal"))
    _tls_failure(other, "server_name elsewhere.internal")


def test_a_certificate_from_another_ca_is_refused_at_once(pki: dict[str, Any], serve: Serve,
                                                          connect: Connect) -> None:
    server = serve(ServerTls(pki["server"].cert_file, pki["server"].key_file))
    client = connect(server.url, ClientTls(ca_file=pki["other_ca"].ca_file))
    _tls_failure(client, pki["other_ca"].ca_file, "ca_file")
    assert not client.events


def test_mutual_tls(pki: dict[str, Any], serve: Serve, connect: Connect) -> None:
    server = serve(ServerTls(pki["server"].cert_file, pki["server"].key_file, pki["client_ca"].ca_file))
    ca = pki["server_ca"].ca_file
    client, stranger = pki["client"], pki["stranger"]
    connect(server.url, ClientTls(ca_file=ca, cert_file=client.cert_file, key_file=client.key_file)).wait(
        _rows(len(ROWS)))
    _tls_failure(connect(server.url, ClientTls(ca_file=ca)), "client certificate")
    _tls_failure(connect(server.url, ClientTls(ca_file=ca, cert_file=stranger.cert_file,
                                               key_file=stranger.key_file)), stranger.cert_file)


def test_source_tls_from_the_configuration(pki: dict[str, Any], serve: Serve, protocol: str) -> None:
    server = serve(ServerTls(pki["named"].cert_file, pki["named"].key_file, pki["client_ca"].ca_file))
    client = pki["client"]
    config = parse_config(
        f'snapshotter {{ source {{ server = "{server.url}", protocol = {protocol}, table = items, '
        f'tls {{ ca_file = "{pki["server_ca"].ca_file}", cert_file = "{client.cert_file}", '
        f'key_file = "{client.key_file}", server_name = laredo.internal }} }}, '
        'destinations = [ { type = local, path = /unused } ] }', env={})
    assert config.tables[0].source.tls == ClientTls(pki["server_ca"].ca_file, client.cert_file, client.key_file,
                                                    "laredo.internal")
    collector = Collector(build_subscriber(config.tables[0]))
    try:
        collector.wait(_rows(len(ROWS)))
    finally:
        collector.stop()


def test_a_server_without_tls_is_named(pki: dict[str, Any], protocol: str, connect: Connect) -> None:
    server = run_fanout_server(ScriptedSource(ROWS), "public", "items", protocol=protocol, ready_timeout=10)
    try:
        _tls_failure(connect(server.url, ClientTls(ca_file=pki["server_ca"].ca_file)), "does not speak TLS")
    finally:
        server.stop()


def test_unusable_tls_files_fail_before_connecting(pki: dict[str, Any], tmp_path: Path, protocol: str) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(SourceConfigError, match=r"cannot read the TLS CA file .*nope\.pem"):
        LaredoSubscriber("https://127.0.0.1:1", "public", "items", protocol=protocol, tls=ClientTls(ca_file=missing))
    not_a_key = pki["client"].cert_file
    with pytest.raises(SourceConfigError, match="unusable TLS files"):
        LaredoSubscriber("https://127.0.0.1:1", "public", "items", protocol=protocol,
                         tls=ClientTls(cert_file=pki["client"].cert_file, key_file=not_a_key))
    secret = Path(pki["client"].key_file).read_text()
    with pytest.raises(SourceConfigError) as caught:
        LaredoSubscriber("https://127.0.0.1:1", "public", "items", protocol=protocol,
                         tls=ClientTls(ca_file=pki["client"].key_file))
    assert secret.splitlines()[1] not in str(caught.value)  # a key's contents never appear in a message


@pytest.mark.slow
def test_fanout_serve_command_serves_both_transports_over_mutual_tls(pki: dict[str, Any], tmp_path: Path) -> None:
    conf = tmp_path / "fanout.conf"
    conf.write_text('snapshotter { source { type = generator, table = items, generator { seed = 3, rows = 25 } }, '
                    'destinations = [ { type = local, path = /unused } ] }')
    port, grpc_port = _free_port(), _free_port()
    server = pki["server"]
    command = [str(Path(sys.executable).with_name("snapshotter")), "fanout-serve", "--config", str(conf),
               "--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port),
               "--tls-cert", server.cert_file, "--tls-key", server.key_file,
               "--tls-client-ca", pki["client_ca"].ca_file]
    log = tmp_path / "fanout.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sink)
    client = pki["client"]
    tls = ClientTls(ca_file=pki["server_ca"].ca_file, cert_file=client.cert_file, key_file=client.key_file)
    collectors = [Collector(LaredoSubscriber(url, "public", "items", protocol=protocol, tls=tls, backoff_initial=0.2,
                                             backoff_max=0.5))
                  for protocol, url in (("connect", f"https://127.0.0.1:{port}"), ("grpc", f"grpcs://127.0.0.1:{grpc_port}"))]
    try:
        for collector in collectors:  # the clients retry until the server listens
            collector.wait(_rows(25), timeout=90.0)
    finally:
        for collector in collectors:
            collector.stop()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 0, log.read_text()[-2000:]
    assert main(["fanout-serve", "--config", str(conf), "--tls-cert", server.cert_file]) == 1  # needs --tls-key


def test_fanout_config_tls_section(pki: dict[str, Any]) -> None:
    server = pki["server"]
    spec = {"cert_file": server.cert_file, "key_file": server.key_file, "client_ca_file": pki["client_ca"].ca_file}
    config = FanoutConfig.from_mapping({"source": {"table": "items"}, "fanout": {"tls": spec}})
    assert config.tls == ServerTls(server.cert_file, server.key_file, pki["client_ca"].ca_file)
    with pytest.raises(ValueError, match=r"fanout\.tls: unknown key 'ca_file'"):
        FanoutConfig.from_mapping({"source": {"table": "items"}, "fanout": {"tls": {**spec, "ca_file": "x"}}})
    with pytest.raises(ValueError, match="needs a certificate and its key"):
        FanoutConfig.from_mapping({"source": {"table": "items"}, "fanout": {"tls": {"cert_file": server.cert_file}}})


def test_a_tls_url_without_settings_verifies_against_the_system_cas(pki: dict[str, Any], serve: Serve,
                                                                    protocol: str) -> None:
    server = serve(ServerTls(pki["server"].cert_file, pki["server"].key_file))
    subscriber = LaredoSubscriber(server.url, "public", "items", protocol=protocol, backoff_initial=0.05,
                                  backoff_max=0.05)
    client = Collector(subscriber)
    try:
        _tls_failure(client, "the system CAs", "check source.tls.ca_file")
    finally:
        client.stop()


def test_a_tls_client_that_goes_away_frees_its_slot(pki: dict[str, Any], serve: Serve, connect: Connect) -> None:
    server = serve(ServerTls(pki["server"].cert_file, pki["server"].key_file))
    client = connect(server.url, ClientTls(ca_file=pki["server_ca"].ca_file))
    client.wait(_rows(len(ROWS)))
    assert server.stats()["clients"] == 1
    client.stop()
    deadline = time.monotonic() + 10.0
    while server.stats()["clients"] != 0:  # noticed while idle: heartbeats every 0.2s, no writes needed
        assert time.monotonic() < deadline, "the server still holds the session of a client that left"
        time.sleep(0.05)
