"""realengine's VllmServer.busy / wait_idle (what the benches drain the engine with between turns), read from a
vLLM-shaped /metrics page served on a real socket: no vLLM needed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from realengine.vllm_server import VllmConfig, VllmServer


def page(running: float, waiting: float) -> str:
    """vLLM 0.32's two gauges as it renders them (one series per model and engine), with a neighbour family."""
    labels = 'engine="0",model_name="tiny-llama"'
    return (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{labels}}} {running}\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{labels}}} {waiting}\n"
            f"vllm:num_requests_waiting_by_reason{{{labels},reason=\"capacity\"}} 7.0\n")


@pytest.fixture
def served() -> Iterator[tuple[VllmServer, list[str]]]:
    current = [page(2.0, 1.0)]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = current[0].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield VllmServer(VllmConfig(port=httpd.server_address[1])), current
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_busy_sums_running_and_waiting_only(served):
    server, _ = served
    assert server.busy() == 3.0  # not the waiting-by-reason family's 7


def test_wait_idle_returns_once_drained_and_says_when_it_is_not(served):
    server, current = served
    with pytest.raises(RuntimeError, match="still busy after 0.3 s"):
        server.wait_idle(0.3)
    threading.Timer(0.3, lambda: current.__setitem__(0, page(0.0, 0.0))).start()
    server.wait_idle(10)
    assert server.busy() == 0.0
