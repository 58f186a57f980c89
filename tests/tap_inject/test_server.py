"""The webhook served for real: TLS on loopback, a real HTTPS POST of an AdmissionReview, the limits (413, 411,
a silent client, the connection cap), the certificate reloaded when its files change, and the counters page."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest

from exporter.tap_inject import cli, review, server
from exporter.tap_inject import pod as P
from exporter.tap_inject.counters import Counters
from exporter.webconfig import TlsServerConfig


@pytest.fixture
def running(certs, settings, tmp_path) -> Iterator[dict[str, Any]]:
    crt, key = certs["issue"]("first")
    live_crt, live_key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(crt, live_crt)
    shutil.copy(key, live_key)
    counters = Counters()
    servers, stop = server.start(settings, ("127.0.0.1", 0), ("127.0.0.1", 0),
                                 TlsServerConfig(str(live_crt), str(live_key)), counters, reload_s=0.1,
                                 max_connections=4)
    client = ssl.create_default_context(cafile=str(certs["ca"]))
    yield {"port": servers[0].server_address[1], "metrics": servers[1].server_address[1], "ctx": client,
           "counters": counters, "crt": live_crt, "key": live_key}
    stop()


def https(env: dict[str, Any]) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", env["port"], context=env["ctx"], timeout=10)


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_a_real_https_post_of_a_review_is_answered_with_the_patch(running, make_pod, make_review):
    req = make_review(make_pod({P.LABEL_TAP: P.ENABLED}))
    conn = https(running)
    status, body = post(conn, server.PATH_POD, json.dumps(req).encode())
    assert status == 200
    resp = json.loads(body)["response"]
    assert resp["uid"] == req["request"]["uid"] and resp["allowed"] and resp["patchType"] == "JSONPatch"
    assert any(op["path"] == "/spec/containers/-" for op in json.loads(base64.b64decode(resp["patch"])))
    # The same connection again (the API server keeps it alive): another pod, left alone.
    other = make_review(make_pod())
    status, body = post(conn, server.PATH_POD, json.dumps(other).encode())
    assert status == 200 and "patch" not in json.loads(body)["response"]
    status, body = post(conn, server.PATH_NAMESPACE, json.dumps(other).encode())
    assert status == 200 and "patch" in json.loads(body)["response"]
    conn.close()
    assert running["counters"].injected == 2 and running["counters"].skipped[P.SKIP_NOT_OPTED_IN] == 1


def test_the_certificate_is_verified_by_its_ca(running):
    wrong = ssl.create_default_context()  # the system's CAs: they did not sign it
    conn = http.client.HTTPSConnection("127.0.0.1", running["port"], context=wrong, timeout=10)
    with pytest.raises(ssl.SSLCertVerificationError):
        conn.request("GET", "/healthz")
    conn = https(running)
    conn.request("GET", "/readyz")
    assert conn.getresponse().status == 200


def test_an_oversized_body_is_refused_with_413_before_it_is_read(running):
    conn = https(running)
    conn.putrequest("POST", server.PATH_POD)
    conn.putheader("Content-Length", str(server.MAX_BODY_BYTES + 1))
    conn.endheaders()  # no body sent: the answer must not wait for it
    resp = conn.getresponse()
    assert resp.status == 413 and resp.getheader("Connection") == "close"
    assert running["counters"].errors[review.ERROR_TOO_LARGE] == 1


def test_a_length_of_thousands_of_digits_is_refused_with_413_not_an_exception(running):
    before = running["counters"].errors[review.ERROR_TOO_LARGE]
    conn = https(running)
    conn.putrequest("POST", server.PATH_POD)
    conn.putheader("Content-Length", "9" * 5000)  # past Python's int() digit limit: a ValueError if converted
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413
    assert running["counters"].errors[review.ERROR_TOO_LARGE] == before + 1


def test_a_body_without_its_length_is_refused_with_411(running):
    conn = https(running)
    conn.putrequest("POST", server.PATH_POD)
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"2\r\n{}\r\n0\r\n\r\n")
    assert conn.getresponse().status == 411
    assert running["counters"].errors[review.ERROR_BAD_HTTP] == 1


def test_malformed_json_is_a_400_and_unknown_paths_a_404(running):
    conn = https(running)
    assert post(conn, server.PATH_POD, b"{not json")[0] == 400
    assert post(conn, "/validate", b"{}")[0] == 404
    assert running["counters"].errors[review.ERROR_BAD_JSON] == 1


def test_a_silent_client_holds_no_one_else_up_and_the_cap_closes_extra_connections(running, make_pod, make_review):
    silent = [socket.create_connection(("127.0.0.1", running["port"])) for _ in range(3)]  # no handshake sent
    try:
        conn = https(running)  # the 4th slot: answered while three others say nothing
        assert post(conn, server.PATH_POD, json.dumps(make_review(make_pod())).encode())[0] == 200
        extra = socket.create_connection(("127.0.0.1", running["port"]), timeout=5)
        assert extra.recv(1) == b""  # over the cap of 4: closed at once
        extra.close()
        assert running["counters"].errors[review.ERROR_OVERLOADED] == 1
        conn.close()
    finally:
        for s in silent:
            s.close()


def _served_cn(env: dict[str, Any]) -> str:
    with socket.create_connection(("127.0.0.1", env["port"]), timeout=5) as raw:
        with env["ctx"].wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            subject = dict(x[0] for x in tls.getpeercert()["subject"])
    return subject["commonName"]


def _wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_a_renewed_certificate_is_served_without_a_restart_and_a_broken_one_is_not(running, certs):
    assert _served_cn(running) == "first"
    running["key"].write_text("not a key")  # half-written renewal: refused, the old pair stays
    time.sleep(0.5)
    assert _served_cn(running) == "first"
    crt, key = certs["issue"]("renewed")
    shutil.copy(key, running["key"])
    shutil.copy(crt, running["crt"])
    assert _wait_for(lambda: _served_cn(running) == "renewed")


def test_the_counters_are_served_over_plain_http(running, make_pod, make_review):
    post(https(running), server.PATH_POD, json.dumps(make_review(make_pod({P.LABEL_TAP: P.DISABLED}))).encode())
    conn = http.client.HTTPConnection("127.0.0.1", running["metrics"], timeout=10)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    page = resp.read().decode()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    assert 'llm_tap_injector_skipped_total{reason="opted_out"} 1' in page


@pytest.mark.parametrize(("args", "says"), [
    (["--tap-image", "ghcr.io/llmslo/llmslo:latest"], "--tap-image"),
    (["--tap-image", "ghcr.io/llmslo/llmslo@sha256:" + "0" * 64], "--tap-image"),
    (["--tap-image", "r/x@sha256:" + "ab" * 32, "--slo-configmap", "Bad_Name"], "--slo-configmap"),
    (["--tap-image", "r/x@sha256:" + "ab" * 32, "--listen-port", "9402"], "--listen-port and --metrics-port"),
    (["--tap-image", "r/x@sha256:" + "ab" * 32, "--metrics-listen", "nowhere"], "--metrics-listen"),
])
def test_the_command_refuses_bad_flags_naming_each(args, says, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv(cli.TAP_IMAGE_ENV, raising=False)
    code = cli.main(["--tls-cert-file", str(tmp_path / "c"), "--tls-key-file", str(tmp_path / "k"), *args])
    assert code == cli.EXIT_CONFIG and says in capsys.readouterr().err


def test_the_command_refuses_a_key_pair_that_does_not_load(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(cli.TAP_IMAGE_ENV, "r/x@sha256:" + "ab" * 32)
    (tmp_path / "c").write_text("junk")
    (tmp_path / "k").write_text("junk")
    code = cli.main(["--tls-cert-file", str(tmp_path / "c"), "--tls-key-file", str(tmp_path / "k"),
                     "--listen", "127.0.0.1:0", "--metrics-listen", "off"])
    assert code == cli.EXIT_CONFIG and "certificate" in capsys.readouterr().err


def test_the_exporters_entrypoint_runs_the_injector(capsys):
    from exporter import cli as exporter_cli

    with pytest.raises(SystemExit) as exit_info:
        exporter_cli.main(["tap-injector", "--help"])
    assert exit_info.value.code == 0 and "--tap-image" in capsys.readouterr().out
