"""The /metrics server: endpoints, gzip, and Prometheus web-config TLS / basic auth / bearer token,
over real sockets with certificates made by openssl."""

from __future__ import annotations

import asyncio
import base64
import gzip
import os
import shutil
import ssl
from pathlib import Path

import aiohttp
import bcrypt
import pytest

from exporter.collector import Snapshot
from exporter.config import ConfigError, Listen
from exporter.model import NormSample
from exporter.server import start_server
from exporter.snapshot import SnapshotHolder, publishable
from exporter.webconfig import PLAIN_HTTP_OPT_IN, load_web_config
from llmslo import conventions as c

LOOPBACK = Listen("127.0.0.1", 0)
PLAIN_HTTP = f"{PLAIN_HTTP_OPT_IN}: true\n"  # these servers take credentials over loopback


def hashed(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def ready_holder() -> SnapshotHolder:
    holder = SnapshotHolder()
    sample = NormSample(c.EXPORTER_CYCLES, {}, 7.0)
    holder.publish(publishable(Snapshot((sample,), (), 0, 1, 0.0, 0.0)))
    return holder


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def get(url: str, headers: dict | None = None, ssl_ctx=None, **session_kw) -> tuple[int, bytes, dict]:
    async with aiohttp.ClientSession(**session_kw) as s:
        async with s.get(url, headers=headers or {}, ssl=ssl_ctx if ssl_ctx is not None else True) as r:
            return r.status, await r.read(), dict(r.headers)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_endpoints_without_web_config():
    async def go():
        holder = SnapshotHolder()
        server = await start_server(holder, LOOPBACK)
        base = f"http://127.0.0.1:{server.port}"
        try:
            early = [(await get(base + p))[0] for p in ("/healthz", "/readyz", "/metrics")]
            published = ready_holder().current
            holder.publish(published)
            late = [(await get(base + p))[0] for p in ("/healthz", "/readyz", "/metrics", "/")]
            status, body, headers = await get(base + "/metrics")
            _, raw, gz_headers = await get(base + "/metrics", {"Accept-Encoding": "gzip"}, auto_decompress=False)
            return early, late, body, headers, raw, gz_headers, published
        finally:
            await server.stop()

    early, late, body, headers, raw, gz_headers, published = asyncio.run(go())
    assert early == [200, 503, 503]
    assert late == [200, 200, 200, 200]
    assert body == published.body and b"llm_exporter_collection_cycles_total 7" in body
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert gz_headers["Content-Encoding"] == "gzip" and gzip.decompress(raw) == body


def test_basic_auth_from_a_web_config(tmp_path):
    cfg = write(tmp_path / "web.yml", f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed('s3cret')}'\n"
                                      "http_server_config:\n  headers:\n    X-Frame-Options: deny\n")

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg))
        base = f"http://127.0.0.1:{server.port}"
        try:
            return {
                "none": await get(base + "/metrics"),
                "wrong": await get(base + "/metrics", basic("alice", "nope")),
                "unknown": await get(base + "/metrics", basic("mallory", "s3cret")),
                "bearer": await get(base + "/metrics", {"Authorization": "Bearer s3cret"}),
                "right": await get(base + "/metrics", basic("alice", "s3cret")),
                "again": await get(base + "/metrics", basic("alice", "s3cret")),  # cached check
                "health": await get(base + "/healthz"),
                "ready": await get(base + "/readyz"),
            }
        finally:
            await server.stop()

    r = asyncio.run(go())
    assert r["none"][0] == 401 and r["none"][2]["WWW-Authenticate"].startswith("Basic")
    assert r["wrong"][0] == r["unknown"][0] == r["bearer"][0] == 401
    assert r["right"][0] == r["again"][0] == 200 and b"llm_exporter_collection_cycles_total" in r["right"][1]
    assert r["right"][2]["X-Frame-Options"] == "deny" and r["none"][2]["X-Frame-Options"] == "deny"
    assert r["health"][0] == r["ready"][0] == 200  # probes carry no credentials


def test_bearer_token_extension(tmp_path):
    write(tmp_path / "tokens", "# scrape tokens\nfirst-token\n\nsecond-token  # rotated in\n")
    cfg = write(tmp_path / "web.yml", PLAIN_HTTP + "bearer_token_file: tokens\n")  # relative to the web-config file

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg))
        base = f"http://127.0.0.1:{server.port}/metrics"
        try:
            return [(await get(base, h))[0] for h in (
                None, {"Authorization": "Bearer first-token"}, {"Authorization": "Bearer second-token"},
                {"Authorization": "Bearer first"}, basic("first-token", "x"))]
        finally:
            await server.stop()

    assert asyncio.run(go()) == [401, 200, 200, 401, 401]


def test_tls_with_a_self_signed_ca(tmp_path, certs):
    cfg = write(tmp_path / "web.yml", f"tls_server_config:\n  cert_file: {certs['server_crt']}\n"
                                      f"  key_file: {certs['server_key']}\n  min_version: TLS13\n")

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg))
        try:
            assert server.scheme == "https"
            trusting = ssl.create_default_context(cafile=str(certs["ca_crt"]))
            status, body, _ = await get(f"https://127.0.0.1:{server.port}/metrics", ssl_ctx=trusting)
            with pytest.raises(aiohttp.ClientError):  # a client that does not trust the CA
                await get(f"https://127.0.0.1:{server.port}/metrics")
            old = ssl.create_default_context(cafile=str(certs["ca_crt"]))
            old.maximum_version = ssl.TLSVersion.TLSv1_2
            with pytest.raises(aiohttp.ClientError):  # below min_version
                await get(f"https://127.0.0.1:{server.port}/metrics", ssl_ctx=old)
            with pytest.raises(aiohttp.ClientError):  # plain HTTP to the TLS port
                await get(f"http://127.0.0.1:{server.port}/metrics")
            return status, body
        finally:
            await server.stop()

    status, body = asyncio.run(go())
    assert status == 200 and b"llm_exporter_collection_cycles_total" in body


def test_mutual_tls_and_allowed_sans(tmp_path, certs):
    def config(sans: str) -> Path:
        return write(tmp_path / f"web-{sans}.yml", (
            f"tls_server_config:\n  cert_file: {certs['server_crt']}\n  key_file: {certs['server_key']}\n"
            f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {certs['ca_crt']}\n"
            f"  client_allowed_sans: ['{sans}']\n"))

    def client_ctx(with_cert: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(certs["ca_crt"]))
        if with_cert:
            ctx.load_cert_chain(str(certs["client_crt"]), str(certs["client_key"]))
        return ctx

    async def go(cfg: Path):
        server = await start_server(ready_holder(), LOOPBACK, str(cfg))
        url = f"https://127.0.0.1:{server.port}/metrics"
        try:
            try:
                without = (await get(url, ssl_ctx=client_ctx(False)))[0]
            except aiohttp.ClientError:
                without = "refused"
            return without, (await get(url, ssl_ctx=client_ctx(True)))[0]
        finally:
            await server.stop()

    assert asyncio.run(go(config("prometheus.monitoring"))) == ("refused", 200)
    assert asyncio.run(go(config("someone.else")))[1] == 403


def test_rotated_certificates_are_served_without_a_restart(tmp_path, certs):
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(certs["server_crt"], crt)
    shutil.copy(certs["server_key"], key)
    cfg = write(tmp_path / "web.yml", "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    new_crt, new_key = certs["issue"]("rotated", "IP:127.0.0.1")

    async def served_cn(port: int) -> str:
        ctx = ssl.create_default_context(cafile=str(certs["ca_crt"]))
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        cert = writer.get_extra_info("peercert")
        writer.close()
        await writer.wait_closed()
        return dict(x[0] for x in cert["subject"])["commonName"]

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg), watch_interval_s=0.05)
        try:
            before = await served_cn(server.port)
            shutil.copy(new_key, key)  # as cert-manager rewrites a mounted secret
            shutil.copy(new_crt, crt)
            for _ in range(100):
                await asyncio.sleep(0.05)
                if await served_cn(server.port) == "rotated":
                    break
            return before, await served_cn(server.port)
        finally:
            await server.stop()

    assert asyncio.run(go()) == ("server", "rotated")


def test_rate_limit(tmp_path):
    cfg = write(tmp_path / "web.yml", "rate_limit:\n  interval: 10s\n  burst: 2\n")

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg))
        try:
            return [(await get(f"http://127.0.0.1:{server.port}/metrics"))[0] for _ in range(3)]
        finally:
            await server.stop()

    assert asyncio.run(go()) == [200, 200, 429]


def test_web_config_changes_apply_without_a_restart(tmp_path):
    cfg = write(tmp_path / "web.yml", f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed('old')}'\n")

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg), watch_interval_s=0.05)
        url = f"http://127.0.0.1:{server.port}/metrics"
        try:
            before = (await get(url, basic("alice", "old")))[0]
            write(cfg, f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed('new')}'\n")
            for _ in range(100):
                await asyncio.sleep(0.05)
                if (await get(url, basic("alice", "new")))[0] == 200:
                    break
            switched = (await get(url, basic("alice", "new")))[0], (await get(url, basic("alice", "old")))[0]
            write(cfg, "basic_auth_users: [\n")  # a broken edit keeps the last good config
            await asyncio.sleep(0.3)
            return before, switched, (await get(url, basic("alice", "new")))[0]
        finally:
            await server.stop()

    assert asyncio.run(go()) == (200, (200, 401), 200)


def test_an_unexpected_reload_error_does_not_stop_the_watcher(tmp_path, monkeypatch, caplog):
    import exporter.server as server_module

    cfg = write(tmp_path / "web.yml", f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed('old')}'\n")
    real_load = server_module.load_web_config
    calls = []

    def load_failing_once(path):
        calls.append(path)
        if len(calls) == 1:
            raise RuntimeError("disk went away")
        return real_load(path)

    def edit(text: str, mtime_s: int) -> None:
        write(cfg, text)
        os.utime(cfg, (mtime_s, mtime_s))  # a distinct mtime even on a coarse-grained file system

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg), watch_interval_s=0.05)
        monkeypatch.setattr(server_module, "load_web_config", load_failing_once)
        url = f"http://127.0.0.1:{server.port}/metrics"
        try:
            edit(f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed('new')}'\n", 1_000_000)
            for _ in range(250):
                if calls:
                    break
                await asyncio.sleep(0.02)
            after_failure = (await get(url, basic("alice", "old")))[0]  # the previous settings stay
            edit(f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed('newer')}'\n", 2_000_000)
            for _ in range(100):
                if (await get(url, basic("alice", "newer")))[0] == 200:
                    break
                await asyncio.sleep(0.05)
            return after_failure, (await get(url, basic("alice", "newer")))[0], (await get(url, basic("alice", "old")))[0]
        finally:
            await server.stop()

    with caplog.at_level("ERROR", logger="llmslo.exporter"):
        assert asyncio.run(go()) == (200, 200, 401)
    assert "event=web_config_reload_failed error=RuntimeError" in caplog.text and "disk went away" in caplog.text


@pytest.mark.parametrize("text, expected", [
    ("tls_server_config:\n  key_file: k\n", "tls_server_config.cert_file: missing"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  client_auth_type: RequireAnyClientCert\n",
     "use RequireAndVerifyClientCert"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  client_auth_type: RequireAndVerifyClientCert\n",
     "client_ca_file"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS14\n", "tls_server_config.min_version"),
    ("tls_server_config:\n  cert: inline\n  key: inline\n", "use cert_file and key_file"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "cipher_suites"),
    ("basic_auth_users:\n  alice: plaintext\n", "basic_auth_users.alice: not a bcrypt hash"),
    ("basic_auth_user:\n  alice: x\n", "basic_auth_user: unknown setting"),
    ("bearer_token_file: /nonexistent/tokens\n", "bearer_token_file: cannot read"),
    ("http_server_config:\n  headers:\n    X-Powered-By: me\n", "header not allowed"),
    ("rate_limit:\n  interval: soon\n  burst: 2\n", "rate_limit"),
    # passwords over plain HTTP only on the operator's explicit word
    (f"basic_auth_users:\n  alice: '{'$2b$04$' + 'a' * 53}'\n",
     f"basic_auth_users: credentials without tls_server_config would cross the network in clear text (fix: add "
     f"tls_server_config with cert_file and key_file, or, where a trusted network carries the scrapes, set "
     f"{PLAIN_HTTP_OPT_IN}: true"),
    (f"{PLAIN_HTTP_OPT_IN}: sure\n", f"{PLAIN_HTTP_OPT_IN}: expected true or false"),
    # TLS settings every handshake would refuse are refused at load
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS10\n",
     "tls_server_config.min_version: TLS10 is refused by OpenSSL 3 (every handshake would fail) (fix: use one of TLS12, TLS13)"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS11\n  max_version: TLS12\n",
     "tls_server_config.min_version: TLS11 is refused"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  max_version: TLS11\n", "tls_server_config.max_version: TLS11 is refused"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS13\n  max_version: TLS12\n",
     "tls_server_config.max_version: TLS12 is below min_version TLS13"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  cipher_suites: [TLS_NO_SUCH_SUITE]\n",
     "tls_server_config.cipher_suites: not supported"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  curve_preferences: [CurveP256]\n",
     "tls_server_config.curve_preferences: not supported"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  curve_preferences: []\n", "tls_server_config.curve_preferences"),
])
def test_bad_web_configs_name_the_field_and_the_fix(tmp_path, text, expected):
    cfg = write(tmp_path / "web.yml", text)
    with pytest.raises(ConfigError) as err:
        load_web_config(cfg)
    message = str(err.value)
    assert message.startswith(str(cfg)) and expected in message and "(fix: " in message


def test_a_key_that_does_not_match_its_certificate_is_reported(tmp_path, certs):
    cfg = write(tmp_path / "web.yml", f"tls_server_config:\n  cert_file: {certs['server_crt']}\n"
                                      f"  key_file: {certs['client_key']}\n")

    async def go():
        await start_server(ready_holder(), LOOPBACK, str(cfg))

    with pytest.raises(ConfigError, match="cannot load the certificate"):
        asyncio.run(go())


@pytest.mark.parametrize("parser", ["c", "python"])
def test_a_request_target_with_a_control_del_or_non_ascii_byte_gets_400(monkeypatch, parser):
    """With aiohttp's C parser and with its pure-Python one (used where the C one is not built)."""
    if parser == "python":
        import aiohttp.http_parser
        import aiohttp.web_protocol

        monkeypatch.setattr(aiohttp.web_protocol, "HttpRequestParser", aiohttp.http_parser.HttpRequestParserPy)

    async def status_of(port: int, target: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status = (await reader.read()).split(b"\r\n", 1)[0].split(b" ")[1]
        writer.close()
        return status

    async def go():
        server = await start_server(ready_holder(), LOOPBACK)
        try:
            bad = [await status_of(server.port, b"/metrics" + byte) for byte in
                   (b"\x1b[2J", b"\x01", b"\t", b"\x7f", b"\x80", b"\x9b", b"\xc3\xa9", b"\xff")]
            good = [await status_of(server.port, t) for t in (b"/metrics", b"/metrics?x=%1B%7F%C3%A9", b"/%C3%A9")]
            return bad, good
        finally:
            await server.stop()

    bad, good = asyncio.run(go())
    assert bad == [b"400"] * 8
    assert good == [b"200", b"200", b"404"]


def test_credentials_over_plain_http_start_only_when_opted_in_and_with_a_warning(tmp_path, caplog):
    write(tmp_path / "tokens", "a-token\n")
    refused = write(tmp_path / "refused.yml", "bearer_token_file: tokens\n")
    with pytest.raises(ConfigError, match="bearer_token_file: credentials without tls_server_config"):
        load_web_config(refused)
    cfg = write(tmp_path / "web.yml", PLAIN_HTTP + "bearer_token_file: tokens\n")

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg))
        try:
            return (await get(f"http://127.0.0.1:{server.port}/metrics", {"Authorization": "Bearer a-token"}))[0]
        finally:
            await server.stop()

    with caplog.at_level("WARNING", logger="llmslo.exporter"):
        assert asyncio.run(go()) == 200
    (warning,) = [r for r in caplog.records if "credentials_over_plain_http" in r.getMessage()]
    assert warning.levelname == "WARNING" and str(cfg) in warning.getMessage()


def test_basic_auth_over_tls_starts_without_an_opt_in_or_a_warning(tmp_path, certs, caplog):
    cfg = write(tmp_path / "web.yml", f"tls_server_config:\n  cert_file: {certs['server_crt']}\n"
                                      f"  key_file: {certs['server_key']}\n  min_version: TLS12\n  max_version: TLS12\n"
                                      f"basic_auth_users:\n  alice: '{hashed('s3cret')}'\n")

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg))
        trusting = ssl.create_default_context(cafile=str(certs["ca_crt"]))
        try:
            url = f"https://127.0.0.1:{server.port}/metrics"
            return (await get(url, basic("alice", "s3cret"), ssl_ctx=trusting))[0], (await get(url, ssl_ctx=trusting))[0]
        finally:
            await server.stop()

    with caplog.at_level("WARNING", logger="llmslo.exporter"):
        assert asyncio.run(go()) == (200, 401)
    assert "credentials_over_plain_http" not in caplog.text
