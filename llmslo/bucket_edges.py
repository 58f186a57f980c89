"""The bucket edges of every engine's latency histograms: what an engine-sourced latency SLI can measure.

The exporter keeps each engine's own bucket edges (it re-labels buckets, it never re-buckets), so
`bucket{le=T} / count` is exact only where T is an edge, and where it is not, the bucket series
does not exist: an engine-sourced `llmslo/latency` SLI at such a T is blind (a whole cluster
without the edge has no error ratio) or wrong (an engine without the edge in a cluster with one
counts every request as too slow). slogen checks each engine-sourced threshold against this table
at build time (slogen/plugins/llm.py) and alerts at run time where series lack the edge anyway
(slogen/rules/bucket_alerts.py): engines configured with other buckets are not in any table.

One table, `ROWS`: one row per engine kind and version range whose edges differ, with the finite
edges (seconds, as the exporter writes them after unit conversion) of each latency metric as
`llmslo/latency` names it (ttft, tpot, itl, e2e). A metric the engine does not export is absent
from the row; an empty tuple means the series exist with no finite edge (Triton's E2E is a count
and a sum, with only `le="+Inf"`). Each row names the upstream file it was read from; rows that
could not be checked against the newest upstream say so.

The engine kinds are the exporter's (`exporter/config.py` ENGINE_KINDS, without the tap): the
value of the `engine` label on every normalized series (conventions.LABEL_ENGINE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from llmslo import conventions as C
from llmslo import gateways as gw
from llmslo import genai

# Latency metrics, as the llmslo/latency plugin's `metric` option names them.
METRIC_TTFT = "ttft"
METRIC_TPOT = "tpot"  # per request, after the first token
METRIC_ITL = "itl"  # per token
METRIC_E2E = "e2e"
LATENCY_METRIC_NAMES = (METRIC_TTFT, METRIC_TPOT, METRIC_ITL, METRIC_E2E)


@dataclass(frozen=True)
class EdgeRow:
    """The latency bucket edges of one engine kind over one version range."""

    kind: str
    versions: str  # e.g. ">=0.11" ("" when one row covers the kind); shown in build errors and runbooks
    edges: Mapping[str, tuple[float, ...]]  # metric -> finite edges, ascending; absent: not exported
    source: str  # where the edges were read: repository, path, release or commit
    configurable: str = ""  # how an operator can change them (then only the run-time alert knows)
    notes: str = ""  # what could not be verified
    # The releases the row covers, as version numbers [since, until) (None: unbounded); what a spec's
    # `engine_versions` option is matched against (llmslo/engine_versions.py). Releases no row covers are
    # gaps nobody checked, not guesses.
    since: tuple[int, ...] | None = None
    until: tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        return f"{self.kind} {self.versions}".strip()

    def exports(self, metric: str) -> bool:
        return metric in self.edges

    def has_edge(self, metric: str, threshold: float) -> bool:
        """Whether `threshold` is one of the metric's edges (exact float equality: the `le` regex
        matches the shortest round-trip text of the same float, nothing near it)."""
        return threshold in self.edges.get(metric, ())


def _geometric(first: float, factor: float, n: int) -> tuple[float, ...]:
    """TGI's duration buckets, computed as its router computes them: `value *= factor`, n times."""
    out, value = [], first
    for _ in range(n):
        value *= factor
        out.append(value)
    return tuple(out)


# vLLM. Newest: vllm/v1/metrics/buckets.py @ 139b1c3f (main, 2026): TIME_TO_FIRST_TOKEN_BUCKETS,
# INTER_TOKEN_LATENCY_BUCKETS, REQUEST_LATENCY_BUCKETS; the same lists are inline in
# vllm/v1/metrics/loggers.py of 0.10.1.1 and 0.33.0 (shared/peers/engine-metrics, exec'd from the wheels).
_VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
              40.0, 80.0, 160.0, 640.0, 2560.0)
_VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_VLLM_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)
# SGLang 0.5: python/sglang/srt/observability/metrics_collector.py (TokenizerMetricsCollector defaults),
# identical in the 0.5.23 wheel and in main @ 44cedc2b.
_SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
_SGLANG_ITL = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
               0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
_SGLANG_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
               600.0, 1200.0, 1800.0, 2400.0)
# TGI: router/src/server.rs (~l. 1937), every metric whose name ends in "duration": 0.0001 * 1.5^k, k = 1..35.
_TGI_DURATION = _geometric(0.0001, 1.5, 35)

ROWS: tuple[EdgeRow, ...] = (
    EdgeRow(C.ENGINE_VLLM, ">=0.11",
            {METRIC_TTFT: _VLLM_TTFT, METRIC_TPOT: _VLLM_ITL, METRIC_ITL: _VLLM_ITL, METRIC_E2E: _VLLM_REQUEST},
            "vllm-project/vllm vllm/v1/metrics/buckets.py @ 139b1c3f (main, 2026); vllm/v1/metrics/loggers.py "
            "of the 0.33.0 wheel (shared/peers/engine-metrics/vllm-v1.prom)",
            configurable="newer main lets an operator override a bucket family (ObservabilityConfig histogram "
                         "buckets); the release that added it was not checked",
            notes="TPOT (request_time_per_output_token_seconds) uses the inter-token-latency family: read in 0.33.0, "
                  "not in main's loggers.py",
            since=(0, 11)),
    EdgeRow(C.ENGINE_VLLM, "0.10",
            {METRIC_TTFT: _VLLM_TTFT, METRIC_ITL: _VLLM_ITL, METRIC_E2E: _VLLM_REQUEST},
            "vllm-project/vllm vllm/v1/metrics/loggers.py of the 0.10.1.1 wheel "
            "(shared/peers/engine-metrics/vllm-v1-0.10-transition.prom); ITL is its time_per_output_token_seconds",
            since=(0, 10), until=(0, 11)),
    EdgeRow(C.ENGINE_VLLM, "0.6 (V0)",
            {METRIC_TTFT: _VLLM_TTFT[:16], METRIC_ITL: _VLLM_ITL[:13], METRIC_E2E: _VLLM_REQUEST[:15]},
            "vllm-project/vllm vllm/engine/metrics.py of the 0.6.6.post1 wheel "
            "(shared/peers/engine-metrics/vllm-v0-legacy.prom); ITL is its time_per_output_token_seconds",
            notes="V0 releases after 0.6.6 were not checked; they may carry V1's longer lists",
            since=(0, 6), until=(0, 6, 7)),
    EdgeRow(C.ENGINE_SGLANG, "0.5",
            {METRIC_TTFT: _SGLANG_TTFT, METRIC_TPOT: _SGLANG_ITL, METRIC_ITL: _SGLANG_ITL, METRIC_E2E: _SGLANG_E2E},
            "sgl-project/sglang python/sglang/srt/observability/metrics_collector.py @ 44cedc2b (main) and "
            "in the 0.5.23 wheel (shared/peers/engine-metrics/sglang.prom)",
            configurable="server arguments --bucket-time-to-first-token, --bucket-inter-token-latency, "
                         "--bucket-e2e-request-latency",
            notes="TPOT (request_time_per_output_token_seconds) edges are the 0.5.23 wheel's (the ITL list); "
                  "main's metrics_collector.py @ 44cedc2b does not define that histogram: unverified for main. "
                  "Releases between 0.4.6 and 0.5 were not checked",
            since=(0, 5)),
    EdgeRow(C.ENGINE_SGLANG, "<0.4.6",
            {METRIC_TTFT: (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0,
                    20.0, 25.0, 30.0),
             METRIC_ITL: (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                   1.0, 2.5),
             METRIC_E2E: (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)},
            "sgl-project/sglang docs/references/production_metrics.md @ 40ef116f (a verbatim /metrics page, "
            "shared/peers/engine-metrics/sglang-legacy-docs.prom); ITL is its time_per_output_token_seconds",
            notes="read from a documented page, not from that release's source",
            until=(0, 4, 6)),
    EdgeRow(C.ENGINE_TGI, "v3 router",
            {METRIC_TPOT: _TGI_DURATION, METRIC_E2E: _TGI_DURATION},
            "huggingface/text-generation-inference router/src/server.rs @ db931fcf (2026-01-08, the last commit: "
            "the repository is in maintenance mode): tgi_request_mean_time_per_token_duration, tgi_request_duration",
            notes="TGI exports no TTFT and no ITL",
            since=(3,)),
    EdgeRow(C.ENGINE_TRTLLM_TRITON, "",
            {METRIC_TTFT: (0.1, 0.5, 2.0, 5.0), METRIC_E2E: ()},
            "triton-inference-server/server docs/user_guide/metrics.md @ e1db8a60 (2026-08): "
            "nv_inference_first_response_histogram_ms default buckets 100, 500, 2000, 5000 ms (opt-in, "
            "--metrics-config histogram_latencies=true); E2E is nv_inference_request_duration_us, a counter: "
            "the exporter writes count and sum and only le=\"+Inf\"",
            configurable="per model, model_metrics histogram_options buckets in the model configuration",
            notes="no TPOT and no ITL"),
    EdgeRow(C.ENGINE_TRTLLM_SERVE, "",
            {METRIC_TTFT: _VLLM_TTFT, METRIC_TPOT: _VLLM_ITL, METRIC_E2E: _VLLM_REQUEST},
            "NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py @ 050f80de (2026): MetricsCollector defaults",
            configurable="MetricsCollector(*_buckets=...) arguments",
            notes="no ITL"),
    EdgeRow(C.ENGINE_LLAMACPP, "",
            {},
            "ggml-org/llama.cpp tools/server/server-task.cpp @ 0c1e570 (vendored by llama-cpp-python 0.3.36): "
            "to_metrics() writes counters and gauges only",
            notes="llama.cpp's server exports no latency histogram: its TTFT, TPOT, ITL and E2E come from the tap"),
)


# Gateways (source llm-d, envoy-ai-gateway, dynamo: llmslo/gateways.py): their own histograms, read as Prometheus
# scrapes them. A gateway-sourced threshold must be an edge of the gateway's current row (`until` None); older rows
# say what a deployment of an older release has, shown in the refusal, with `buckets:` to declare them.
# llm-d/llm-d-router pkg/epp/metrics/llm_d_router_metrics.go and metrics.go (generalLatencyBuckets) @ ebab687.
_LLMD_TTFT = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0,
              20.0, 30.0, 45.0, 60.0, 120.0)
_LLMD_TPOT = (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8,
              1.0, 2.0)
_LLMD_ITL = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0)
_LLMD_DURATION = _LLMD_TTFT + (180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0,
                               3600.0)


def dynamo_log_buckets(low: float, high: float, count: int) -> tuple[float, ...]:
    """Dynamo's frontend edges as lib/llm/src/http/service/metrics.rs computes them (generate_log_buckets): 0, then
    count - 1 log-spaced values from `low` to `high`, each rounded to 2 significant figures (Rust's f64::round,
    half away from zero), duplicates dropped. The same float steps, so the same `le` text."""
    def sig2(value: float) -> float:
        scale = math.pow(10.0, 1.0 - math.floor(math.log10(abs(value))))
        scaled = value * scale
        whole = math.floor(scaled)
        return (whole + 1.0 if scaled - whole >= 0.5 else whole) / scale
    out = [0.0]
    for i in range(1, count):
        value = sig2(math.exp(math.log(low) + (math.log(high) - math.log(low)) * i / (count - 1)))
        if value != out[-1]:
            out.append(value)
    return tuple(out)


_DYNAMO_TTFT = dynamo_log_buckets(0.001, 480.0, 18)
_DYNAMO_SRC = "ai-dynamo/dynamo lib/llm/src/http/service/metrics.rs (Metrics::new defaults, DYN_METRICS_*)"

GATEWAY_ROWS: tuple[EdgeRow, ...] = (
    EdgeRow(gw.SOURCE_LLMD, "main",
            {METRIC_TTFT: _LLMD_TTFT, METRIC_TPOT: _LLMD_TPOT, METRIC_ITL: _LLMD_ITL, METRIC_E2E: _LLMD_DURATION},
            "llm-d/llm-d-router pkg/epp/metrics/llm_d_router_metrics.go @ ebab687 (2026-08-22): "
            "llm_d_epp_request_ttft_seconds, _streaming_tpot_seconds, _streaming_itl_seconds, _duration_seconds "
            "(generalLatencyBuckets, metrics.go)",
            notes="fixed in the code: no bucket setting"),
    EdgeRow(gw.SOURCE_ENVOY, ">=0.5",
            {METRIC_TTFT: genai.TTFT_EDGES, METRIC_TPOT: genai.TPOT_EDGES, METRIC_E2E: genai.REQUEST_DURATION_EDGES},
            "envoyproxy/ai-gateway internal/metrics/genai.go @ c217da8 (v1.1, 2026-08-21); TTFT extended to 60 s by "
            "#1793 (9f2d185, 2026-01-20, first in v0.5.0); TPOT and duration: the OpenTelemetry GenAI convention's",
            notes="fixed in the code: no bucket setting"),
    EdgeRow(gw.SOURCE_ENVOY, "<0.5",
            {METRIC_TTFT: genai.TTFT_EDGES[:16], METRIC_TPOT: genai.TPOT_EDGES,
             METRIC_E2E: genai.REQUEST_DURATION_EDGES},
            "envoyproxy/ai-gateway internal/metrics/genai.go before #1793 (9f2d185): the convention's TTFT up to 10 s",
            until=(0, 5)),
    EdgeRow(gw.SOURCE_DYNAMO, "main since #14839 (2026-09)",
            {METRIC_TTFT: _DYNAMO_TTFT, METRIC_ITL: dynamo_log_buckets(0.001, 80.0, 20),
             METRIC_E2E: dynamo_log_buckets(1.0, 512.0, 10)},
            _DYNAMO_SRC + ": TTFT (0.001, 480, 18); ITL (0.001, 80, 20) since PR #14839 (merged 2026-09-15, its "
            "edges listed there); request duration (1, 512, 10) since PR #8087 (2026-04-10)",
            configurable="DYN_METRICS_TTFT_{MIN,MAX,COUNT}, DYN_METRICS_ITL_*, DYN_METRICS_REQUEST_DURATION_*",
            notes="Dynamo exports no per-request TPOT"),
    EdgeRow(gw.SOURCE_DYNAMO, "before #14839",
            {METRIC_TTFT: _DYNAMO_TTFT, METRIC_ITL: dynamo_log_buckets(0.001, 2.0, 13),
             METRIC_E2E: dynamo_log_buckets(1.0, 512.0, 10)},
            _DYNAMO_SRC + " before PR #14839: ITL (0.001, 2, 13); request duration (1, 256, 10) before PR #8087",
            configurable="DYN_METRICS_* as above", notes="request duration before PR #8087: (1, 256, 10)",
            until=(0,)),
)


def gateway_rows(source: str, metric: str | None = None, *, current: bool = False) -> list[EdgeRow]:
    """A gateway's rows (newest first); `current`: only the one a new deployment runs (no `until`)."""
    return [r for r in GATEWAY_ROWS if r.kind == source and (metric is None or r.exports(metric))
            and not (current and r.until is not None)]


# The goodput tap's default ladders (seconds; exporter/tap/metrics.py), to which each tap adds every threshold
# of the SLO files it reads. Chosen to resolve interactive objectives (tens to hundreds of ms) and long
# generations. Every tap of a deployment reads the same files, so the tap's histograms share one ladder
# fleet-wide: the one source whose buckets may be summed across engines (slogen.promql.check_one_ladder).
TAP_LATENCY_LADDER = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0,
    30.0, 60.0, 120.0, 300.0,
)
TAP_TPOT_LADDER = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.3,
    0.5, 1.0, 2.5,
)


def rows(kinds: Iterable[str] = C.SERVING_ENGINE_KINDS, metric: str | None = None) -> list[EdgeRow]:
    """The rows of these engine kinds (in table order); with `metric`, only those that export it."""
    wanted = set(kinds)
    return [r for r in ROWS if r.kind in wanted and (metric is None or r.exports(metric))]


def nearest(edges: Iterable[float], threshold: float) -> tuple[float | None, float | None]:
    """The largest edge below `threshold` and the smallest above it (None where there is none)."""
    below = [e for e in edges if e < threshold]
    above = [e for e in edges if e > threshold]
    return (max(below) if below else None, min(above) if above else None)


def common_edges(selected: Iterable[EdgeRow], metric: str) -> tuple[float, ...]:
    """The edges every one of these rows has for `metric` (ascending; rows that do not export it are skipped)."""
    sets = [frozenset(r.edges[metric]) for r in selected if r.exports(metric)]
    if not sets:
        return ()
    return tuple(sorted(frozenset.intersection(*sets)))


def edge_text(edge: float) -> str:
    """An edge as a user writes it back into a spec: the shortest round-trip digits, `1` for `1.0`."""
    text = repr(float(edge))
    return text[:-2] if text.endswith(".0") else text
