"""Every option of the tap, in one list: the CLI parses it, `--workers` forwards it to each worker.

`add_arguments` is the only place an option is declared; exporter.tap.workers walks the same list
to rebuild a worker's command line, so a new option reaches the workers without being named there.
"""

from __future__ import annotations

import argparse
import math

from exporter.logs import LOG_FORMATS
from exporter.tap.addresses import host_port, metrics_address
from exporter.tap.admission import non_negative_float, non_negative_int, poll_seconds, shed_margin
from exporter.tap.deadlines import FIRST_TOKEN_FLOOR_S, MULTIPLE, RESPONSE_FLOOR_S, STALL_FLOOR_S
from exporter.tap.gate_reading import AUTO, ENGINE_KINDS
from exporter.tap.gate_state import DEFAULT_FALLBACK_FOOTPRINT, DEFAULT_MAX_QUEUE, DEFAULT_MIN_SEATS, DEFAULT_POLL_S
from exporter.tap.models import DEFAULT_REFRESH_S, refresh_seconds
from exporter.tap.predict import DEFAULT_SHED_MARGIN
from exporter.tap.reload import DEFAULT_INTERVAL_S as DEFAULT_RELOAD_S
from exporter.tap.reload import reload_interval
from exporter.tap.settings import DEFAULT_HEAD_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_BUFFERED_BODY_BYTES
from exporter.tap.turns import header_name
from llmslo.argtypes import number_arg

positive_int = number_arg(int, lambda n: n > 0, "a positive whole number")
positive_float = number_arg(float, lambda x: 0 < x < math.inf, "a positive number of seconds")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every tap option. `--workers` re-creates them for its worker processes from this list."""
    _serving_arguments(p)
    _deadline_arguments(p)
    _limit_arguments(p)
    _admission_arguments(p)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--log-format", default=LOG_FORMATS[0], choices=LOG_FORMATS,
                   help="logfmt (default: event=NAME key=value ...) or json (one object per line)")


def _serving_arguments(p: argparse.ArgumentParser) -> None:
    """Where the tap listens, what it relays to, and how it runs."""
    p.add_argument("--listen", type=host_port, required=True, metavar="HOST:PORT", help="where clients connect")
    p.add_argument("--upstream", required=True, metavar="URL", help="the engine's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--metrics-listen", type=metrics_address, required=True, metavar="HOST:PORT",
        help="where the tap serves its /metrics (or unix:PATH)",
    )
    p.add_argument(
        "--workers", type=positive_int, default=1, metavar="N",
        help="relay in N processes sharing the proxy port (one core each); /metrics sums their counters and "
             "labels their gauges by worker (default 1)",
    )
    p.add_argument(
        "--reuse-port", action="store_true",
        help="bind the proxy port with SO_REUSEPORT, so that several processes share it (--workers does this)",
    )
    p.add_argument(
        "--upstream-ca", default="", metavar="FILE",
        help="PEM certificates to trust for an https:// upstream (default: the system's CAs)",
    )
    p.add_argument(
        "--slo", action="extend", nargs="+", default=[], metavar="FILE",
        help="SLO YAML files or directories (repeatable): goodput classes and tap latency thresholds",
    )
    p.add_argument(
        "--slo-reload-interval", type=reload_interval, default=DEFAULT_RELOAD_S, metavar="SECONDS",
        help="check the --slo files this often and reload them when their contents change (in-flight requests "
             f"keep their objectives); 0: only on SIGHUP (default {DEFAULT_RELOAD_S:g})",
    )
    p.add_argument(
        "--max-body-bytes", type=positive_int, default=DEFAULT_MAX_BODY_BYTES, metavar="N",
        help=f"reject larger request bodies with 413 (default {DEFAULT_MAX_BODY_BYTES})",
    )
    p.add_argument(
        "--no-inject-usage", action="store_true",
        help="never add stream_options.include_usage upstream; n_out then counts chunks (usage_source=chunks)",
    )
    p.add_argument(
        "--models-refresh", type=refresh_seconds, default=DEFAULT_REFRESH_S, metavar="SECONDS",
        help="read the upstream's GET /v1/models this often: only the names it lists, or that a class's model "
        f"globs match, become model label values (0: never read it, globs only; default {DEFAULT_REFRESH_S:g})",
    )
    p.add_argument(
        "--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
        help="auto: uvloop when installed (less CPU and a shorter tail per relayed chunk), else asyncio's own",
    )
    p.add_argument("--shutdown-grace", type=float, default=10.0, metavar="SECONDS", help="in-flight time on SIGTERM")
    p.add_argument(
        "--genai-names", action="store_true",
        help="also expose TTFT, TPOT and request duration under the OpenTelemetry GenAI names and buckets "
             "(gen_ai_server_time_to_first_token_seconds, gen_ai_server_time_per_output_token_seconds, "
             "gen_ai_server_request_duration_seconds, by gen_ai_request_model), as Envoy AI Gateway writes them, so "
             "its dashboards read the tap; off by default (three more histograms per model)",
    )


def _deadline_arguments(p: argparse.ArgumentParser) -> None:
    """Deadlines towards the engine (exporter.tap.deadlines) and who sets a request's objectives."""
    p.add_argument(
        "--first-token-timeout", type=positive_float, default=None, metavar="SECONDS",
        help=f"end a streamed completion with no output event after this long as upstream_timeout (504, or the "
             f"stream broken off); default: {FIRST_TOKEN_FLOOR_S:g} s or {MULTIPLE:g}x the largest TTFT objective",
    )
    p.add_argument(
        "--stall-timeout", type=positive_float, default=None, metavar="SECONDS",
        help=f"end a completion whose response stops flowing for this long as upstream_timeout; default: "
             f"{STALL_FLOOR_S:g} s or {MULTIPLE:g}x the largest TPOT objective",
    )
    p.add_argument(
        "--response-timeout", type=positive_float, default=None, metavar="SECONDS",
        help=f"answer 504 when any other request has no response head after this long; default: "
             f"{RESPONSE_FLOOR_S:g} s or {MULTIPLE:g}x the largest TTFT or E2E objective",
    )
    p.add_argument(
        "--trusted-gateway-objectives", "--trust-slo-headers", dest="trust_slo_headers", action="store_true",
        help="the gateway in front (e.g. llm-d's router) is trusted to set each request's objectives: honour its "
             "x-slo-class, x-slo-ttft-ms and x-slo-tpot-ms headers, bounded to the plausible ranges, snapped down to a "
             "fixed ladder and counted under a derived class such as chat@ttft400-tpot50 (at most 32). Off by "
             "default: every x-slo-* header is ignored, since a client that can reach the tap could otherwise make "
             "its own requests good. Turn it on only when clients cannot reach the tap except through that gateway, "
             "and the gateway drops or overwrites these headers from its clients",
    )


def _limit_arguments(p: argparse.ArgumentParser) -> None:
    """Bounds on what a client controls."""
    p.add_argument(
        "--max-connections", type=positive_int, default=None, metavar="N",
        help="refuse client connections beyond N with 503 (default: half the open-file limit, which the tap "
             "raises to its hard limit at start, less a reserve)",
    )
    p.add_argument(
        "--head-timeout", type=positive_float, default=DEFAULT_HEAD_TIMEOUT_S, metavar="SECONDS",
        help=f"a request head must arrive whole within this long; trickling bytes do not extend it "
             f"(default {DEFAULT_HEAD_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--max-buffered-body-bytes", type=positive_int, default=DEFAULT_MAX_BUFFERED_BODY_BYTES, metavar="N",
        help=f"answer 503 to a request whose body would take the bodies held by the tap over N bytes "
             f"(default {DEFAULT_MAX_BUFFERED_BODY_BYTES})",
    )
    p.add_argument(
        "--client-idle-timeout", type=float, default=75.0, metavar="SECONDS",
        help="close a client connection with no request in flight after this long without a byte (default 75)",
    )


def _admission_arguments(p: argparse.ArgumentParser) -> None:
    """KV admission (exporter.tap.admission)."""
    p.add_argument(
        "--admission", action="store_true",
        help="admission by objective: read the engine's /metrics (through the exporter's adapters, "
             "--admission-engine) and answer a new completion 429 with Retry-After when the engine would not start "
             "it within its class's TTFT objective, or its running requests miss the TPOT objective "
             "(docs/capacity.md); requests already admitted are never touched; an unreadable engine is admitted to",
    )
    p.add_argument(
        "--admission-engine", choices=(AUTO, *ENGINE_KINDS), default=AUTO,
        help="the engine kind whose /metrics admission reads (default auto: detected from the page); its adapter "
             "must give free KV blocks and the block size",
    )
    p.add_argument(
        "--admission-sheddable", action="extend", nargs="+", default=[], metavar="CLASS",
        help="a goodput class (from --slo) shed first: refused at --admission-shed-margin x the objectives, "
             "its own or the tightest class's (repeatable; e.g. batch); other classes are refused last",
    )
    p.add_argument(
        "--admission-shed-margin", type=shed_margin, default=DEFAULT_SHED_MARGIN, metavar="FRACTION",
        help=f"the share of the objectives at which sheddable classes are refused (default {DEFAULT_SHED_MARGIN:g})",
    )
    p.add_argument(
        "--admission-min-seats", type=non_negative_float, default=DEFAULT_MIN_SEATS, metavar="SEATS",
        help="an operator floor, off by default: also refuse while free KV tokens / p99 request footprint, less "
             "the requests admitted since the last reading, is under SEATS",
    )
    p.add_argument(
        "--admission-max-queue", type=non_negative_int, default=DEFAULT_MAX_QUEUE, metavar="N",
        help="an operator floor, off by default: also refuse a request that would be queued behind the engine's "
             "queue and the admitted requests beyond its free seats with more than N waiting (itself included)",
    )
    p.add_argument(
        "--admission-poll-interval", type=poll_seconds, default=DEFAULT_POLL_S, metavar="SECONDS",
        help=f"read the engine's /metrics this often for admission (default {DEFAULT_POLL_S:g})",
    )
    p.add_argument(
        "--admission-footprint", type=positive_int, default=DEFAULT_FALLBACK_FOOTPRINT, metavar="TOKENS",
        help="the p99 request footprint (prompt + output tokens) to assume until the engine's request token "
             f"histograms have a finished request (default {DEFAULT_FALLBACK_FOOTPRINT})",
    )
    p.add_argument(
        "--admission-client-header", type=header_name, default=None, metavar="NAME",
        help="tell refused clients apart by this request header (e.g. authorization, or a user header your ingress "
             "sets), hashed, instead of by their address; off by default: any client can send any value, so name "
             "one only when a proxy in front sets or checks it (docs/capacity.md, \"Retry-After and turns\")",
    )
    p.add_argument(
        "--admission-taps", type=positive_int, default=1, metavar="N",
        help="tap processes gating this one engine, each on its own (default 1; --workers multiplies it): each "
             "counts what it admitted since the engine's last reading, and its requests in flight, N times",
    )
