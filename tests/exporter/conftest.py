"""Shared fixtures for the exporter runtime tests: sample pages, loopback engines, certificates."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from tests.exporter.sample_pages import SAMPLE_PAGES, SHARED_PAGES
from tests.helpers.needs import shared_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def pages_dir() -> Path:
    return shared_dir(SHARED_PAGES, "engine sample pages").resolve()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def start_http(routes: dict[str, Handler], ssl_context=None) -> tuple[web.AppRunner, str]:
    """An aiohttp server on a free loopback port; returns the runner and its base URL."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
    scheme = "https" if ssl_context else "http"
    return runner, f"{scheme}://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
def http_server():
    """`await http_server(routes, ssl_context=None)` -> (runner, base URL); the test cleans the runner up."""
    return start_http


@pytest.fixture
def sample_pages(pages_dir: Path) -> dict[Path, str]:
    """Every sample page's path with the engine kind it comes from."""
    return {pages_dir / name: kind for name, kind in SAMPLE_PAGES.items()}


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(d: Path, name: str, san: str) -> tuple[Path, Path]:
    """A key and a certificate for `san`, signed by the CA in `d`."""
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)
    return d / f"{name}.crt", d / f"{name}.key"


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, made with openssl.

    Keys: ca_crt, ca_key, server_crt, server_key, client_crt, client_key, and `issue`: a function
    (name, san) -> (crt, key) for more certificates from the same CA.
    """
    assert shutil.which("openssl"), "the TLS tests need the openssl command (Debian package openssl)"
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    server_crt, server_key = _issue(d, "server", "IP:127.0.0.1,DNS:localhost")
    client_crt, client_key = _issue(d, "client", "DNS:prometheus.monitoring")
    return {"ca_crt": d / "ca.crt", "ca_key": d / "ca.key", "server_crt": server_crt, "server_key": server_key,
            "client_crt": client_crt, "client_key": client_key, "issue": lambda name, san: _issue(d, name, san)}
