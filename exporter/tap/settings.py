"""The tap's settings, given once at start (exporter.tap.cli builds them from its options)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# Every request body being received or handed to the engine, together: 16 concurrent uploads of
# 31 MB would otherwise hold half a gigabyte. Four such bodies fit at once; more wait for a 503.
DEFAULT_MAX_BUFFERED_BODY_BYTES = 128 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 4096  # the CLI derives its default from the file-descriptor limit instead
# A request head must arrive whole within this long (from the connection's accept, or from its first
# byte on a kept-alive connection): trickling bytes do not extend it (slowloris). nginx: 60 s per read.
DEFAULT_HEAD_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TapSettings:
    upstream: str  # base URL of the engine, e.g. http://127.0.0.1:8000
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    inject_usage: bool = True
    connect_timeout_s: float = 10.0
    # A client connection with no request in flight is closed after this long without a byte
    # from it (nginx: keepalive_timeout 75s), so idle or stalled clients cannot pile up.
    client_idle_timeout_s: float = 75.0
    upstream_ca: str = ""  # PEM file of CAs to trust for an https:// upstream ("" = the system's)
    # Deadlines towards the engine (exporter.tap.deadlines); None = derived from the SLO files.
    first_token_timeout_s: float | None = None
    stall_timeout_s: float | None = None
    response_timeout_s: float | None = None
    # x-slo-class / x-slo-ttft-ms / x-slo-tpot-ms change what a request is held to, so any client could make
    # its own requests good; honoured only when the operator says the gateway in front is trusted
    # (--trusted-gateway-objectives; exporter.tap.objectives bounds and folds them).
    trust_slo_headers: bool = False
    # --genai-names: the TTFT, TPOT and duration histograms also under the OpenTelemetry GenAI names (exporter.tap.genai)
    genai_names: bool = False
    # Abuse limits: what one client controls is bounded, so no client can starve the others.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    max_buffered_body_bytes: int = DEFAULT_MAX_BUFFERED_BODY_BYTES
