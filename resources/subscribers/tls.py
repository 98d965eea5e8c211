"""TLS for laredo's Sync stream: the client side (`source.tls`) and the fan-out server's side.

laredo-server serves gRPC only over TLS, usually with a private CA, so the client takes the CA that
signed the server's certificate (`ca_file`; empty: the system trust store), optionally a client
certificate and key for mutual TLS (`cert_file` + `key_file`), and `server_name`, the name to
verify in the server's certificate (and send as SNI) when the address dialled is not that name
(an IP, a load balancer, a tunnel). Both transports use the same settings: Connect through an
`ssl.SSLContext`, gRPC through grpcio's channel credentials.

A certificate problem never fixes itself, so it must not be retried like a dropped connection:
`TlsError` carries a message naming what is wrong (untrusted certificate, name mismatch, client
certificate refused, a server that does not speak TLS) and the subscriber turns it into a
SourceConfigError. Private keys are read from their files only, and never appear in a message.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TlsError(Exception):
    """TLS cannot work as configured (files, certificates, names); retrying will not help."""


#: OpenSSL reasons that mean the peer refused our certificate or does not speak TLS on that port.
_PERMANENT_REASONS = frozenset({
    "CERTIFICATE_VERIFY_FAILED", "TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_HANDSHAKE_FAILURE",
    "WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE", "TLSV1_ALERT_PROTOCOL_VERSION",
    "UNSUPPORTED_PROTOCOL", "TLSV1_ALERT_ACCESS_DENIED", "SSLV3_ALERT_CERTIFICATE_REVOKED",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED",
})


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read the TLS {what} {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True, slots=True)
class ClientTls:
    """`source.tls`: how the laredo client verifies the server and, optionally, identifies itself."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    KEYS = ("ca_file", "cert_file", "key_file", "server_name")

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise TlsError("cert_file and key_file go together (mutual TLS needs both the certificate and its key)")

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that verifies the server (hostname included) against `ca_file`."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        try:
            if self.ca_file:
                _read(self.ca_file, "CA file")
                context.load_verify_locations(cafile=self.ca_file)
            if self.cert_file:
                _read(self.cert_file, "certificate file")
                _read(self.key_file, "key file")
                context.load_cert_chain(self.cert_file, self.key_file)
        except ssl.SSLError as exc:
            raise TlsError(f"unusable TLS files (ca_file {self.ca_file or '-'}, cert_file {self.cert_file or '-'}, "
                           f"key_file {self.key_file or '-'}): {exc.reason or exc}") from None
        return context

    def grpc_credentials(self) -> Any:
        """grpcio channel credentials with the same trust and identity as `ssl_context`."""
        import grpc  # type: ignore[import-untyped]

        self.ssl_context()  # the same checks, with the same messages, before grpcio sees the bytes
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "CA file") if self.ca_file else None,
            private_key=_read(self.key_file, "key file") if self.key_file else None,
            certificate_chain=_read(self.cert_file, "certificate file") if self.cert_file else None,
        )

    def describe(self) -> str:
        """Where the trust comes from, for error messages (file names only, never contents)."""
        parts = [f"ca_file {self.ca_file}" if self.ca_file else "the system CAs"]
        if self.cert_file:
            parts.append(f"client certificate {self.cert_file}")
        if self.server_name:
            parts.append(f"server_name {self.server_name}")
        return ", ".join(parts)


def permanent_ssl_error(exc: BaseException) -> bool:
    """True for a TLS failure no retry can fix (verification, a refused certificate, not TLS at all)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return True
    return isinstance(exc, ssl.SSLError) and getattr(exc, "reason", None) in _PERMANENT_REASONS


def explain_ssl_error(exc: ssl.SSLError, address: str, tls: ClientTls) -> TlsError:
    """A TlsError saying what went wrong with `address`, in terms of the configuration."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or str(exc)
        if "mismatch" in detail or "match" in detail:
            hint = "the certificate is not for that name: set source.tls.server_name to a name it carries"
        else:
            hint = "its certificate is not signed by a trusted CA: check source.tls.ca_file"
        return TlsError(f"TLS verification of {address} failed ({detail}) with {tls.describe()}; {hint}")
    reason = getattr(exc, "reason", None) or str(exc)
    if reason in ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_BAD_CERTIFICATE", "TLSV1_ALERT_UNKNOWN_CA",
                  "SSLV3_ALERT_CERTIFICATE_UNKNOWN"):
        hint = ("the server refused the client certificate" if tls.cert_file else
                "the server requires a client certificate: set source.tls.cert_file and key_file")
    elif reason in ("WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"):
        hint = "the server does not speak TLS on that port"
    else:
        hint = "the TLS handshake was refused"
    return TlsError(f"TLS handshake with {address} failed ({reason}) with {tls.describe()}; {hint}")


#: grpcio reports handshake failures as UNAVAILABLE with these in the details.
_GRPC_TLS_MARKERS = ("handshake failed", "certificate_verify_failed", "hostname verification",
                     "peer name", "not in peer certificate", "tlsv13 alert", "ssl_error_ssl")


def diagnose(host: str, port: int, tls: ClientTls, *, alpn: tuple[str, ...] = ("h2",),
             timeout: float = 2.0) -> TlsError | None:
    """Handshake with the server on a fresh connection to name a TLS failure the transport only saw
    as a closed connection: under TLS 1.3 the client's side of the handshake is done before the
    server checks the client certificate, so a refusal arrives after it, as an alert (Python
    reports it) or, from a gRPC server, as the connection closed before the server's first HTTP/2
    frame (which a healthy one sends at once). None when the server answers normally, or cannot be
    reached at all (transient)."""
    context = tls.ssl_context()
    context.set_alpn_protocols(list(alpn))
    address = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                context.wrap_socket(raw, server_hostname=tls.server_name or host) as conn:
            first = conn.recv(1)
    except ssl.SSLError as exc:
        return explain_ssl_error(exc, address, tls) if permanent_ssl_error(exc) else None
    except OSError:  # refused, reset, timed out: nothing TLS can be blamed for
        return None
    if first or "h2" not in alpn:
        return None
    hint = ("the server refused the client certificate" if tls.cert_file else
            "the server requires a client certificate: set source.tls.cert_file and key_file")
    return TlsError(f"TLS handshake with {address}: the server closed the connection right after it, which is how a "
                    f"gRPC server refuses a client certificate, with {tls.describe()}; {hint}")


def grpc_tls_failure(details: str, host: str, port: int, tls: ClientTls) -> TlsError | None:
    """A TlsError for an UNAVAILABLE whose details show a failed handshake (or, for a closed socket,
    whose diagnosis does), else None."""
    text = details.lower()
    if not any(marker in text for marker in _GRPC_TLS_MARKERS):
        return diagnose(host, port, tls) if "socket closed" in text else None
    address = f"{host}:{port}"
    if "peer name" in text or "not in peer certificate" in text or "hostname verification" in text:
        hint = "the certificate is not for that name: set source.tls.server_name to a name it carries"
    elif "wrong_version_number" in text or "record_layer_failure" in text:
        hint = "the server does not speak TLS on that port"
    elif "certificate_verify_failed" in text:
        hint = "its certificate is not signed by a trusted CA: check source.tls.ca_file"
    elif "certificate required" in text or "certificate_required" in text:
        hint = ("the server refused the client certificate" if tls.cert_file else
                "the server requires a client certificate: set source.tls.cert_file and key_file")
    else:
        hint = "check that the server speaks TLS on that port and trusts this client"
    return TlsError(f"TLS handshake with {address} failed ({details.strip()}) with {tls.describe()}; {hint}")


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The fan-out server's TLS: its certificate and key, and (mutual TLS) the CA of its clients."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""

    KEYS = ("cert_file", "key_file", "client_ca_file")

    def __post_init__(self) -> None:
        if not self.cert_file or not self.key_file:
            raise TlsError("serving TLS needs a certificate and its key (cert_file and key_file)")

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            _read(self.cert_file, "certificate file")
            _read(self.key_file, "key file")
            context.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file:
                _read(self.client_ca_file, "client CA file")
                context.load_verify_locations(cafile=self.client_ca_file)
                context.verify_mode = ssl.CERT_REQUIRED
        except ssl.SSLError as exc:
            raise TlsError(f"unusable server TLS files (cert_file {self.cert_file}, key_file {self.key_file}): "
                           f"{exc.reason or exc}") from None
        return context

    def grpc_credentials(self) -> Any:
        import grpc

        self.ssl_context()
        pair = (_read(self.key_file, "key file"), _read(self.cert_file, "certificate file"))
        if self.client_ca_file:
            return grpc.ssl_server_credentials([pair], root_certificates=_read(self.client_ca_file, "client CA file"),
                                               require_client_auth=True)
        return grpc.ssl_server_credentials([pair])
