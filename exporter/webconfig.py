"""Prometheus' web-config file (exporter-toolkit format): TLS, basic auth, headers, rate limit.

Operators already have these files for node-exporter and friends, so the exporter reads the same
keys. Two extensions, because exporter-toolkit has no bearer tokens and serves passwords over
plain HTTP without a word:

    bearer_token_file: /etc/llmslo/tokens   # one accepted token per line; '#' starts a comment
    allow_credentials_over_plain_http: true # basic auth or tokens without tls_server_config (else refused)

Differences forced by Python's ssl module, each rejected with a clear message rather than
silently weakened: inline `cert`/`key` (the exporter writes no files; use cert_file/key_file),
`RequireAnyClientCert` (Python verifies any certificate it requires; use
RequireAndVerifyClientCert), `cipher_suites` and `curve_preferences` (Go names), TLS10 and TLS11
(OpenSSL 3 refuses their handshakes). `http2` is
accepted and ignored (HTTP/1.1 only). `RequestClientCert` requests nothing, which is equivalent:
Go does not verify such a certificate either.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import re
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from exporter.config import ConfigError
from llmslo.durations import parse_go_duration
from llmslo.problems import describe

CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# TLS 1.0 and 1.1 are not offered: OpenSSL 3 refuses them at its default security level, so a server set to them
# would start and then reset every handshake.
TLS_VERSIONS = {
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_OLD_TLS_VERSIONS = ("TLS10", "TLS11")
ALLOWED_HEADERS = (
    "Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "X-XSS-Protection",
    "Strict-Transport-Security",
)
# llmslo's extension: credentials over plain HTTP only when the operator says so (and a WARNING at start).
PLAIN_HTTP_OPT_IN = "allow_credentials_over_plain_http"
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit", "bearer_token_file",
             PLAIN_HTTP_OPT_IN)
_TLS_KEYS = (
    "cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type", "client_ca_file", "client_allowed_sans",
    "min_version", "max_version", "cipher_suites", "prefer_server_cipher_suites", "curve_preferences",
)


@dataclass(frozen=True)
class TlsServerConfig:
    cert_file: str
    key_file: str
    client_auth_type: str = "NoClientCert"
    client_ca_file: str = ""
    client_ca: str = ""  # inline PEM
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    prefer_server_cipher_suites: bool = True


@dataclass(frozen=True)
class RateLimit:
    interval_s: float  # 0 disables
    burst: int


@dataclass(frozen=True)
class WebConfig:
    path: str
    tls: TlsServerConfig | None = None
    basic_auth_users: dict[str, str] = field(default_factory=dict)  # user -> bcrypt hash
    bearer_tokens: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    rate_limit: RateLimit | None = None
    credentials_over_plain_http: bool = False  # the operator's explicit opt-in (PLAIN_HTTP_OPT_IN)

    @property
    def auth_required(self) -> bool:
        return bool(self.basic_auth_users or self.bearer_tokens)

    def watched_files(self) -> list[str]:
        """Files whose change means a reload (certificates rotate without a restart)."""
        files = [self.path]
        if self.tls:
            files += [f for f in (self.tls.cert_file, self.tls.key_file, self.tls.client_ca_file) if f]
        return files


def _err(path: str, where: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(describe(path, problem, field=where, fix=fix))


def _resolve(base: Path, file: str) -> str:
    """Relative paths are relative to the web-config file's folder, as exporter-toolkit does."""
    return str(file if os.path.isabs(file) else base / file)


def _load_tls(path: str, base: Path, data: Any) -> TlsServerConfig:
    where = "tls_server_config"
    if not isinstance(data, dict):
        raise _err(path, where, "expected a mapping", "write cert_file: and key_file: under it")
    for key in data:
        if key not in _TLS_KEYS:
            raise _err(path, f"{where}.{key}", "unknown setting", f"use one of {', '.join(_TLS_KEYS)}")
    if data.get("cert") or data.get("key"):
        raise _err(path, f"{where}.cert", "inline certificates and keys are not supported (the exporter writes no files)",
                   "put them in files and use cert_file and key_file")
    for key in ("cipher_suites", "curve_preferences"):
        if data.get(key) is not None:
            raise _err(path, f"{where}.{key}", f"not supported: Python's ssl cannot apply Go's names ({data[key]!r})",
                       "remove it; OpenSSL's defaults apply (TLS 1.2+, AEAD suites with forward secrecy, X25519 and "
                       "the NIST curves)")
    for key in ("cert_file", "key_file"):
        if not data.get(key):
            raise _err(path, f"{where}.{key}", "missing", f"add {key}: with the PEM file's path")
    auth = str(data.get("client_auth_type") or "NoClientCert")
    if auth == "RequireAnyClientCert":
        raise _err(path, f"{where}.client_auth_type", "RequireAnyClientCert (a certificate without verification) is not supported",
                   "use RequireAndVerifyClientCert with client_ca_file")
    if auth not in CLIENT_AUTH_TYPES:
        raise _err(path, f"{where}.client_auth_type", f"unknown value {auth!r}", f"use one of {', '.join(CLIENT_AUTH_TYPES)}")
    ca_file = str(data.get("client_ca_file") or "")
    ca_inline = str(data.get("client_ca") or "")
    if CLIENT_AUTH_TYPES[auth] != ssl.CERT_NONE and not (ca_file or ca_inline):
        raise _err(path, f"{where}.client_ca_file", f"{auth} needs the CA that signs client certificates", "add client_ca_file:")
    versions = _load_versions(path, where, data)
    sans = data.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
        raise _err(path, f"{where}.client_allowed_sans", "expected a list of strings", "write - name items")
    prefer = data.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise _err(path, f"{where}.prefer_server_cipher_suites", "expected true or false", "write true or false")
    return TlsServerConfig(
        cert_file=_resolve(base, str(data["cert_file"])),
        key_file=_resolve(base, str(data["key_file"])),
        client_auth_type=auth,
        client_ca_file=_resolve(base, ca_file) if ca_file else "",
        client_ca=ca_inline,
        client_allowed_sans=tuple(sans),
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        prefer_server_cipher_suites=prefer,
    )


def _load_versions(path: str, where: str, data: dict) -> dict[str, str]:
    """min_version and max_version, refused here rather than by every handshake."""
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = str(data.get(key) or default)
        if value in _OLD_TLS_VERSIONS:
            raise _err(path, f"{where}.{key}", f"{value} is refused by OpenSSL 3 (every handshake would fail)",
                       f"use one of {', '.join(TLS_VERSIONS)}")
        if value not in TLS_VERSIONS:
            raise _err(path, f"{where}.{key}", f"unknown TLS version {value!r}", f"use one of {', '.join(TLS_VERSIONS)}")
        versions[key] = value
    if TLS_VERSIONS[versions["max_version"]] < TLS_VERSIONS[versions["min_version"]]:
        raise _err(path, f"{where}.max_version", f"{versions['max_version']} is below min_version {versions['min_version']} "
                   "(no version is left to agree on)", "raise max_version or lower min_version")
    return versions


def _load_users(path: str, data: Any) -> dict[str, str]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _err(path, "basic_auth_users", "expected a mapping of user: bcrypt-hash", "write alice: $2y$10$...")
    users = {}
    for user, hashed in data.items():
        if not isinstance(hashed, str) or not re.match(r"^\$2[aby]?\$\d\d\$[./A-Za-z0-9]{53}$", hashed):
            raise _err(path, f"basic_auth_users.{user}", "not a bcrypt hash",
                       "hash the password with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`")
        users[str(user)] = hashed
    return users


def _load_tokens(path: str, base: Path, file: Any) -> tuple[str, ...]:
    if not file:
        return ()
    token_path = _resolve(base, str(file))
    try:
        lines = Path(token_path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise _err(path, "bearer_token_file", f"cannot read {token_path} ({exc.strerror})", "point it at a readable file") from None
    tokens = tuple(t for t in (line.split("#", 1)[0].strip() for line in lines) if t)
    if not tokens:
        raise _err(path, "bearer_token_file", f"{token_path} holds no token", "write one token per line")
    return tokens


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    path_s = str(path)
    base = Path(path_s).resolve().parent
    try:
        data = yaml.safe_load(Path(path_s).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(describe(path_s, f"cannot read the web config ({exc.strerror})",
                                   fix="pass a readable file to --web.config.file")) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(describe(path_s, "not valid YAML", line=mark.line + 1 if mark else None,
                                   fix="correct the syntax (see the exporter-toolkit web-config format)")) from None
    if not isinstance(data, dict):
        raise _err(path_s, "(top level)", "expected a mapping", "write tls_server_config: / basic_auth_users: keys")
    for key in data:
        if key not in _TOP_KEYS:
            raise _err(path_s, str(key), "unknown setting", f"use one of {', '.join(_TOP_KEYS)}")
    http = data.get("http_server_config") or {}
    headers = (http.get("headers") or {}) if isinstance(http, dict) else None
    if not isinstance(headers, dict):
        raise _err(path_s, "http_server_config.headers", "expected a mapping", "write Header-Name: value pairs")
    for name in headers:
        if name not in ALLOWED_HEADERS:
            raise _err(path_s, f"http_server_config.headers.{name}", "header not allowed", f"use one of {', '.join(ALLOWED_HEADERS)}")
    rate = None
    if data.get("rate_limit"):
        rl = data["rate_limit"]
        try:
            rate = RateLimit(parse_go_duration(str(rl.get("interval", "0"))), int(rl.get("burst", 0)))
        except (ValueError, TypeError, AttributeError) as exc:
            raise _err(path_s, "rate_limit", str(exc), "write interval: 1s and burst: 20") from None
        if rate.interval_s > 0 and rate.burst < 1:
            raise _err(path_s, "rate_limit.burst", "must be at least 1 when interval is set", "set burst: 20 (or interval: 0)")
    web = WebConfig(
        path=path_s,
        tls=_load_tls(path_s, base, data["tls_server_config"]) if data.get("tls_server_config") else None,
        basic_auth_users=_load_users(path_s, data.get("basic_auth_users")),
        bearer_tokens=_load_tokens(path_s, base, data.get("bearer_token_file")),
        headers={str(k): str(v) for k, v in headers.items() if v},
        rate_limit=rate if rate and rate.interval_s > 0 else None,
        credentials_over_plain_http=_plain_http_opt_in(path_s, data),
    )
    if web.auth_required and web.tls is None and not web.credentials_over_plain_http:
        where = "basic_auth_users" if web.basic_auth_users else "bearer_token_file"
        raise _err(path_s, where, "credentials without tls_server_config would cross the network in clear text",
                   f"add tls_server_config with cert_file and key_file, or, where a trusted network carries the scrapes, "
                   f"set {PLAIN_HTTP_OPT_IN}: true (logged at WARNING on every start)")
    return web


def _plain_http_opt_in(path: str, data: dict) -> bool:
    value = data.get(PLAIN_HTTP_OPT_IN, False)
    if not isinstance(value, bool):
        raise _err(path, PLAIN_HTTP_OPT_IN, f"expected true or false, not {value!r}", f"write {PLAIN_HTTP_OPT_IN}: true")
    return value


# --------------------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------------------
def new_ssl_context(tls: TlsServerConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.verify_mode = CLIENT_AUTH_TYPES[tls.client_auth_type]
    load_certificates(ctx, tls)
    return ctx


def load_certificates(ctx: ssl.SSLContext, tls: TlsServerConfig) -> None:
    """(Re)load the key pair and client CA into a live context: new handshakes use them."""
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(describe(tls.cert_file, f"cannot load the certificate and key {tls.key_file} ({exc})",
                                   fix="point cert_file and key_file at a matching PEM pair")) from None
    if tls.client_ca_file or tls.client_ca:
        try:
            if tls.client_ca_file:
                ctx.load_verify_locations(cafile=tls.client_ca_file)
            if tls.client_ca:
                ctx.load_verify_locations(cadata=tls.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(describe(tls.client_ca_file or "client_ca", f"cannot load the client CA ({exc})",
                                       fix="point client_ca_file at a PEM CA certificate")) from None


def peer_sans(peercert: dict | None) -> set[str]:
    if not peercert:
        return set()
    return {value for _, value in peercert.get("subjectAltName", ())}


# --------------------------------------------------------------------------------------
# Authentication
# --------------------------------------------------------------------------------------
@functools.cache
def _dummy_hash() -> bytes:
    """A valid hash of a random password: unknown users cost the same bcrypt time as known ones."""
    return bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(10))



def _checkpw(password: str, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password.encode(), hashed)
    except ValueError:  # e.g. a password longer than bcrypt's 72 bytes
        return False


class Authenticator:
    """Checks an Authorization header; bcrypt (about 60 ms a check) only when no cached answer exists.

    As Prometheus' exporter-toolkit does, a check's outcome is cached by (user, stored hash,
    SHA-256 of the password): a password change, or a reload of the web config (a new
    Authenticator), starts over. Successful checks and failed ones are cached apart, so a flood of
    wrong passwords can evict only other wrong passwords, never a credential that worked.

    `cached()` never blocks (the event loop answers from it); `verify()` runs bcrypt and belongs in
    a thread (the server's bounded bcrypt pool). `check()` is both, for callers that may block.
    """

    _OK_MAX = 256  # credentials that worked: only someone who knows a password can add one
    _BAD_MAX = 64  # failed ones, most recent kept: a retrying misconfigured client costs one bcrypt check

    def __init__(self, web: WebConfig):
        self.web = web
        self._ok: OrderedDict[tuple[str, str, bytes], None] = OrderedDict()
        self._bad: OrderedDict[tuple[str, str, bytes], None] = OrderedDict()
        self._lock = threading.Lock()  # the bcrypt threads write the caches; reads need no lock

    def check(self, authorization: str | None) -> bool:
        """True when the header carries valid basic-auth credentials or an accepted bearer token. Blocking."""
        verdict = self.cached(authorization)
        return self.verify(authorization) if verdict is None else verdict

    def cached(self, authorization: str | None) -> bool | None:
        """The answer without bcrypt: True or False when it is known, None when only bcrypt can tell."""
        if not self.web.auth_required:
            return True
        parsed = self._parse(authorization)
        if isinstance(parsed, bool):
            return parsed
        key = parsed[0]
        if key in self._ok:
            return True
        if key in self._bad:
            return False
        return None

    def verify(self, authorization: str | None) -> bool:
        """The full check, bcrypt included (blocking); the outcome is cached for `cached`."""
        parsed = self._parse(authorization)
        if isinstance(parsed, bool):
            return parsed
        key, password, hashed = parsed
        if hashed is None:
            _checkpw(password, _dummy_hash())  # same cost as a real check: no user enumeration by timing
            ok = False
        else:
            ok = _checkpw(password, hashed.encode())
        with self._lock:
            cache, limit = (self._ok, self._OK_MAX) if ok else (self._bad, self._BAD_MAX)
            cache[key] = None
            cache.move_to_end(key)
            while len(cache) > limit:
                cache.popitem(last=False)
        return ok

    def basic_user(self, authorization: str | None) -> str:
        """The user a basic-auth header names ("" for anything else): the check queue remembers who succeeded."""
        parsed = self._parse(authorization)
        return "" if isinstance(parsed, bool) else parsed[0][0]

    def _parse(self, authorization: str | None) -> bool | tuple[tuple[str, str, bytes], str, str | None]:
        """A final answer (bearer tokens, malformed headers), or the basic credentials' cache key,
        password and stored hash (None for an unknown user)."""
        if not self.web.auth_required:
            return True
        if not authorization:
            return False
        scheme, _, credentials = authorization.partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer" and self.web.bearer_tokens:
            given = credentials.strip().encode()
            return any(hmac.compare_digest(given, t.encode()) for t in self.web.bearer_tokens)
        if scheme == "basic" and self.web.basic_auth_users:
            try:
                user, _, password = base64.b64decode(credentials.strip(), validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            hashed = self.web.basic_auth_users.get(user)
            return (user, hashed or "", hashlib.sha256(password.encode()).digest()), password, hashed
        return False

    @property
    def challenge(self) -> str:
        return 'Basic realm="llmslo-exporter"' if self.web.basic_auth_users else 'Bearer realm="llmslo-exporter"'
