"""`llmslo-exporter podmap`: the one process that reads the kubelet's pod-resources socket, relaying the
GPU-to-pod mapping to the exporter on the same node (exporter/gpu/podmap.py says why it is apart).

It does one thing: GET /v1/owners lists the kubelet (at most once per CACHE_S, whoever asks) and answers
the owners as JSON, 503 with the reason when the kubelet cannot be read; GET /healthz answers 200. One
request at a time, each with a deadline: its only client is the exporter on its node (its NetworkPolicy
admits nothing else), and the kubelet is asked at most once per CACHE_S however often it is called.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer

from exporter.config import DEFAULT_POD_RESOURCES_SOCKET, DEFAULT_POD_RESOURCES_TIMEOUT_S
from exporter.gpu import podmap
from exporter.gpu.podresources import PodResourcesClient, PodResourcesError
from exporter.logs import event, setup

DEFAULT_LISTEN = "0.0.0.0:9412"
CACHE_S = 1.0  # a listing is reused this long: a burst of requests asks the kubelet once
REQUEST_TIMEOUT_S = 5.0


class Relay:
    """The cached listing; PodResourcesError reasons become the answer's error."""

    def __init__(self, client: PodResourcesClient, node: str) -> None:
        self.client, self.node = client, node
        self._lock = threading.Lock()
        self._at = -CACHE_S
        self._answer = (503, podmap.encode_error(node, "not listed yet"))

    def answer(self) -> tuple[int, bytes]:
        with self._lock:
            if time.monotonic() - self._at >= CACHE_S:
                try:
                    self._answer = (200, podmap.encode(self.node, self.client.list_owners()))
                except PodResourcesError as exc:
                    self._answer = (503, podmap.encode_error(self.node, exc.reason))
                self._at = time.monotonic()
            return self._answer


def handler_for(relay: Relay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S  # a client that stops sending cannot hold the one request slot
        server_version = "llmslo-podmap"
        sys_version = ""

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == podmap.OWNERS_PATH:
                self._send(*relay.answer(), "application/json")
            elif self.path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
            pass  # one line per scrape would drown the log; failures are logged by the client side

    return Handler


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llmslo-exporter podmap", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help=f"default {DEFAULT_LISTEN}")
    p.add_argument("--pod-resources-socket", default=DEFAULT_POD_RESOURCES_SOCKET, metavar="PATH",
                   help=f"the kubelet's socket (default {DEFAULT_POD_RESOURCES_SOCKET})")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME") or socket.gethostname(), metavar="NAME",
                   help="the node named in every answer, which the exporter checks (default $NODE_NAME)")
    return p.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    setup("info")
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit() or not os.path.isabs(args.pod_resources_socket):
        print("llmslo-exporter podmap: --listen is HOST:PORT and --pod-resources-socket an absolute path",
              file=sys.stderr)
        return 2
    relay = Relay(PodResourcesClient(args.pod_resources_socket, DEFAULT_POD_RESOURCES_TIMEOUT_S), args.node_name)
    server = HTTPServer((host or "0.0.0.0", int(port)), handler_for(relay))
    event("podmap_listening", listen=args.listen, socket=args.pod_resources_socket, node=args.node_name)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


__all__ = ["Relay", "main"]
