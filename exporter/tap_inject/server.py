"""The webhook over TLS, and its counters over plain HTTP, with the standard library's threaded HTTP server.

Its one client is the API server (the NetworkPolicy admits nothing else) and each review is a few KiB, so a
thread per connection is enough; what a client controls is still bounded: connections (`max_connections`,
one over is closed at once and counted), every socket read (`READ_TIMEOUT_S`, the TLS handshake included, done
in the connection's thread so a silent client never stalls `accept`), the head (http.server's own line and
field limits) and the body (`MAX_BODY_BYTES`: 413 before it is read; a body without Content-Length, 411).

The certificate and key are files (a cert-manager Secret, mounted): they are read again every
`RELOAD_S` seconds and, when changed, checked on a scratch context first and then loaded into the live one,
so new handshakes use the new pair and a half-written or mismatched pair is never taken (webconfig does the
loading, as for the exporter's own TLS).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from exporter.config import ConfigError
from exporter.logs import event
from exporter.tap_inject import review
from exporter.tap_inject.counters import Counters
from exporter.tap_inject.pod import InjectorSettings
from exporter.webconfig import TlsServerConfig, load_certificates, new_ssl_context

MAX_BODY_BYTES = 1 << 20  # an AdmissionReview of a Pod is a few KiB; the API server's own limit is 3 MiB
READ_TIMEOUT_S = 10.0  # every read (the handshake, the head, the body) and every write
RELOAD_S = 10.0
MAX_CONNECTIONS = 64
# The two webhooks of the MutatingWebhookConfiguration: the pod's label opted it in, or its namespace's.
PATH_POD = "/mutate"
PATH_NAMESPACE = "/mutate-namespace"
ROUTES = {PATH_POD: False, PATH_NAMESPACE: True}
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Shared:
    """What every connection's handler reads."""

    settings: InjectorSettings
    counters: Counters


class _Quiet(BaseHTTPRequestHandler):
    """No access log (one line per review would drown the log; the counters say what happened)."""

    protocol_version = "HTTP/1.1"
    timeout = READ_TIMEOUT_S
    server_version = "llmslo-tap-injector"
    sys_version = ""
    shared: Shared

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        pass

    def send_body(self, status: int, body: bytes, content_type: str, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)


class WebhookHandler(_Quiet):
    def setup(self) -> None:
        super().setup()  # sets the read timeout on the socket
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # here, in this connection's thread, under that timeout

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path in ("/healthz", "/readyz"):
            self.send_body(200, b"ok\n", "text/plain")
        else:
            self.send_body(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        route = ROUTES.get(self.path.split("?", 1)[0])
        if route is None:
            self.send_body(404, b"not found: the webhook's paths are /mutate and /mutate-namespace\n", "text/plain")
            return
        body = self._body()
        if body is None:
            return
        result = review.answer(body, route, self.shared.settings)
        self.shared.counters.count(result)
        self.send_body(result.status, result.body, "application/json")

    def _refuse(self, status: int, reason: str, text: str) -> None:
        self.shared.counters.add(reason, error=True)
        self.send_body(status, text.encode() + b"\n", "text/plain", close=True)

    def _body(self) -> bytes | None:
        """The request's body, or None once it has been refused (too large, no length, too slow)."""
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding") is not None or length is None or not (length.isascii() and length.isdigit()):
            self._refuse(411, review.ERROR_BAD_HTTP, "send the review with a Content-Length")
            return None
        if len(length) > len(str(MAX_BODY_BYTES)) or int(length) > MAX_BODY_BYTES:  # int() of 5,000 digits raises
            self._refuse(413, review.ERROR_TOO_LARGE, f"a review is at most {MAX_BODY_BYTES} bytes")
            return None
        try:
            body = self.rfile.read(int(length))
        except TimeoutError:
            self.shared.counters.add(review.ERROR_TIMEOUT, error=True)
            self.close_connection = True
            return None
        if len(body) != int(length):
            self.shared.counters.add(review.ERROR_BAD_HTTP, error=True)
            self.close_connection = True
            return None
        return body


class MetricsHandler(_Quiet):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/metrics":
            self.send_body(200, self.shared.counters.render(), METRICS_CONTENT_TYPE)
        elif self.path == "/healthz":
            self.send_body(200, b"ok\n", "text/plain")
        else:
            self.send_body(404, b"not found\n", "text/plain")


class BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once; TLS when given a context."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], counters: Counters,
                 ssl_context: ssl.SSLContext | None = None, max_connections: int = MAX_CONNECTIONS) -> None:
        self.ssl_context, self.counters = ssl_context, counters
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        if self.ssl_context is None:
            return sock, addr
        return self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.counters.add(review.ERROR_OVERLOADED, error=True)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed handshake or a dropped connection: counted, not a traceback on stderr."""
        import sys

        exc = sys.exc_info()[1]
        reason = (review.ERROR_TLS if isinstance(exc, ssl.SSLError)
                  else review.ERROR_TIMEOUT if isinstance(exc, TimeoutError) else review.ERROR_BAD_HTTP)
        self.counters.add(reason, error=True)


class CertificateReloader:
    """Reloads the live context's key pair when the files' bytes change (checked first on a scratch context)."""

    def __init__(self, context: ssl.SSLContext, tls: TlsServerConfig) -> None:
        self.context, self.tls = context, tls
        self.seen = self._read()

    def _read(self) -> tuple[bytes, bytes]:
        return Path(self.tls.cert_file).read_bytes(), Path(self.tls.key_file).read_bytes()

    def check(self) -> bool:
        """True when a changed pair was loaded; a pair that does not load is logged and the old one kept."""
        try:
            now = self._read()
            if now == self.seen:
                return False
            new_ssl_context(self.tls)  # a failed load can leave a live context half-changed: try a scratch one
            load_certificates(self.context, self.tls)
        except (OSError, ConfigError) as exc:
            event("tap_injector_certificate_reload_failed", logging.WARNING, error=type(exc).__name__,
                  detail=str(exc)[:300])
            return False
        self.seen = now
        event("tap_injector_certificate_reloaded", cert=self.tls.cert_file)
        return True

    def run(self, stop: threading.Event, interval_s: float = RELOAD_S) -> None:
        while not stop.wait(interval_s):
            self.check()


def serve_in_thread(server: BoundedServer, name: str) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    return thread


def start(settings: InjectorSettings, listen: tuple[str, int], metrics_listen: tuple[str, int] | None,
          tls: TlsServerConfig, counters: Counters | None = None, reload_s: float = RELOAD_S,
          max_connections: int = MAX_CONNECTIONS) -> tuple[list[BoundedServer], Callable[[], None]]:
    """Both servers started in threads, and the certificate reloader; returns the servers and a `stop`.
    Raises ConfigError when the key pair cannot be loaded and OSError when a port cannot be bound."""
    counters = counters or Counters()
    shared = Shared(settings, counters)
    context = new_ssl_context(tls)
    webhook = BoundedServer(listen, type("Webhook", (WebhookHandler,), {"shared": shared}), counters, context,
                            max_connections)
    servers = [webhook]
    if metrics_listen is not None:
        servers.append(BoundedServer(metrics_listen, type("Metrics", (MetricsHandler,), {"shared": shared}), counters))
    stop_event = threading.Event()
    threading.Thread(target=CertificateReloader(context, tls).run, args=(stop_event, reload_s), daemon=True,
                     name="cert-reload").start()
    for s in servers:
        serve_in_thread(s, s.RequestHandlerClass.__name__)

    def stop() -> None:
        stop_event.set()
        for s in servers:
            s.shutdown()
            s.server_close()

    return servers, stop


__all__ = ["MAX_BODY_BYTES", "PATH_NAMESPACE", "PATH_POD", "BoundedServer", "CertificateReloader", "start"]
