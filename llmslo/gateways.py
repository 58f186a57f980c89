"""Gateways as SLI sources: each gateway's own series, as Prometheus scrapes them from the gateway, written once.

`llmslo/latency` and `llmslo/availability` take `source: "llm-d"`, `"envoy-ai-gateway"` or `"dynamo"` and read
that gateway's histograms and counters directly (not through our exporter): the names, the model label and the
label values here are the gateway's, read from each project's newest source. Bucket edges: llmslo/bucket_edges.py
(GATEWAY_ROWS). What each measures, and why goodput stays the tap's: docs/slogen.md, "Gateways as SLI sources".

Read from:
- llm-d/llm-d-router @ ebab687 (main, 2026-08-22): pkg/epp/metrics/llm_d_router_metrics.go (the `llm_d_epp_*`
  families, labels model_name, target_model_name, fairness_id, priority; TTFT also `streaming`),
  pkg/epp/metrics/metrics.go (the deprecated `inference_objective_*` twins, still dual-emitted by every Record*
  call; no TTFT or TPOT among them), pkg/epp/handlers/server.go (request_total counted once a request is
  scheduled; request_error_total{error_code} once per failed request, before or after scheduling; a model
  server status other than 200 is `ModelServerError`), pkg/common/error/error.go (the error codes).
- envoyproxy/ai-gateway @ c217da8 (2026-08-21): the OpenTelemetry GenAI histograms (llmslo/genai.py);
  internal/extproc/processor_impl.go: every request ends in one gen_ai.server.request.duration sample, with
  error.type `_OTHER` when it failed (a non-2xx upstream status, or the gateway's own error).
- ai-dynamo/dynamo lib/llm/src/http/service/metrics.rs (newest stored, with the error_type label) and
  lib/runtime/src/metrics/prometheus_names.rs: `dynamo_frontend_*`, label `model` (lowercased by the
  frontend), requests_total{status, error_type}; no per-request TPOT histogram.

Rules read only the newest family of a gateway that emits two (llm-d writes every request to both
`llm_d_epp_request_*` and `inference_objective_request_*`): summing both would count each request twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llmslo import genai

SOURCE_LLMD = "llm-d"
SOURCE_ENVOY = "envoy-ai-gateway"
SOURCE_DYNAMO = "dynamo"

# (label, op, value): a fixed matcher on a gateway's own series.
Fixed = tuple[tuple[str, str, str], ...]


class LLMD:
    """llm-d's router (the endpoint picker, EPP): names and label values as it exports them."""

    PREFIX = "llm_d_epp_"
    TTFT = "llm_d_epp_request_ttft_seconds"  # label streaming: "true" | "false" (non-streamed: the whole duration)
    TPOT = "llm_d_epp_request_streaming_tpot_seconds"  # (e2e - ttft) / (output tokens - 1), streamed only
    ITL = "llm_d_epp_request_streaming_itl_seconds"  # between response body chunks, streamed only
    NTPOT = "llm_d_epp_request_ntpot_seconds"  # e2e / output tokens: not a TPOT (it holds the prefill)
    DURATION = "llm_d_epp_request_duration_seconds"
    REQUESTS = "llm_d_epp_request_total"
    ERRORS = "llm_d_epp_request_error_total"
    LEGACY_PREFIX = "inference_objective_"  # deprecated twins, dual-emitted: never read (double counting)
    LABEL_MODEL = "model_name"  # the model the client asked for
    LABEL_TARGET_MODEL = "target_model_name"  # after the router's rewrite (e.g. a LoRA adapter)
    LABEL_FAIRNESS_ID = "fairness_id"
    LABEL_PRIORITY = "priority"
    LABEL_STREAMING = "streaming"
    LABEL_ERROR_CODE = "error_code"
    # Error codes (pkg/common/error/error.go). The client's own faults are neither good nor bad (as the tap's
    # client_error outcome); ModelServerError is any model server status but 200, 4xx included.
    CLIENT_ERROR_CODES = ("BadRequest", "Unauthorized", "Forbidden", "NotFound", "PreconditionFailed")
    SERVER_ERROR_CODES = ("Unknown", "Internal", "ServiceUnavailable", "ResourceExhausted", "ModelServerError")
    # Failed after scheduling, so already in request_total; every other server error was refused before it.
    DISPATCHED_ERROR_CODES = ("ModelServerError",)


class DYNAMO:
    """NVIDIA Dynamo's frontend: names and label values as it exports them."""

    PREFIX = "dynamo_frontend_"
    TTFT = "dynamo_frontend_time_to_first_token_seconds"
    ITL = "dynamo_frontend_inter_token_latency_seconds"  # per token
    DURATION = "dynamo_frontend_request_duration_seconds"
    REQUESTS = "dynamo_frontend_requests_total"
    LABEL_MODEL = "model"  # lowercased by the frontend
    LABEL_ENDPOINT = "endpoint"
    LABEL_REQUEST_TYPE = "request_type"  # stream | unary
    LABEL_STATUS = "status"
    LABEL_ERROR_TYPE = "error_type"  # "" on success; older releases have no such label
    STATUS_SUCCESS = "success"
    STATUS_ERROR = "error"
    # error_type values that are not the service's failure: a client's invalid request, an unknown model, a
    # client that cancelled (left out of the SLI, as the tap's client_disconnected).
    NEUTRAL_ERROR_TYPES = ("validation", "not_found", "cancelled")


@dataclass(frozen=True)
class Histogram:
    """One latency histogram of a gateway: its family name and the fixed matchers that select what it measures."""

    family: str
    fixed: Fixed = ()

    def bucket(self) -> str:
        return self.family + "_bucket"

    def count(self) -> str:
        return self.family + "_count"


@dataclass(frozen=True)
class Counted:
    """Requests a counter (a sample name, `_total` included) counts where the fixed matchers hold."""

    metric: str
    fixed: Fixed = ()


@dataclass(frozen=True)
class Availability:
    """A gateway's failed requests and every request its SLI counts: `bad` over the sum of `total` (a request
    refused before the counter of all requests counts it is added from its error counter)."""

    bad: Counted
    total: tuple[Counted, ...]
    good_example: Fixed  # label values of a good request, for generated test series
    bad_example: Fixed  # ... and of a failed one, counted in total[0] too
    refused_example: Fixed = ()  # ... and of one refused before total[0] counts it (in bad and total[1:] only)


@dataclass(frozen=True)
class Gateway:
    source: str
    title: str
    model_label: str
    latency: Mapping[str, Histogram]  # llmslo/latency's metric names -> the histogram
    availability: Availability
    labels: Fixed  # the gateway's other labels on every series, for test series shaped as it writes them
    lowercase_models: bool = False  # the gateway lowercases the model label


_STREAMED = ((LLMD.LABEL_STREAMING, "=", "true"),)
_LLMD_BAD = "|".join(LLMD.SERVER_ERROR_CODES)
_LLMD_REFUSED = "|".join(c for c in LLMD.SERVER_ERROR_CODES if c not in LLMD.DISPATCHED_ERROR_CODES)
_DYNAMO_COUNTED = ((DYNAMO.LABEL_ERROR_TYPE, "!~", "|".join(DYNAMO.NEUTRAL_ERROR_TYPES)),)

GATEWAYS: dict[str, Gateway] = {g.source: g for g in (
    Gateway(SOURCE_LLMD, "llm-d router (EPP)", LLMD.LABEL_MODEL,
            {"ttft": Histogram(LLMD.TTFT, _STREAMED), "tpot": Histogram(LLMD.TPOT), "itl": Histogram(LLMD.ITL),
             "e2e": Histogram(LLMD.DURATION)},
            Availability(Counted(LLMD.ERRORS, ((LLMD.LABEL_ERROR_CODE, "=~", _LLMD_BAD),)),
                         (Counted(LLMD.REQUESTS), Counted(LLMD.ERRORS, ((LLMD.LABEL_ERROR_CODE, "=~", _LLMD_REFUSED),))),
                         (), ((LLMD.LABEL_ERROR_CODE, "=", "ModelServerError"),),
                         ((LLMD.LABEL_ERROR_CODE, "=", "ResourceExhausted"),)),
            ((LLMD.LABEL_FAIRNESS_ID, "=", "default-flow"), (LLMD.LABEL_PRIORITY, "=", "0"))),
    Gateway(SOURCE_ENVOY, "Envoy AI Gateway", genai.LABEL_REQUEST_MODEL,
            {"ttft": Histogram(genai.SERVER_TTFT.name), "tpot": Histogram(genai.SERVER_TPOT.name),
             "e2e": Histogram(genai.SERVER_REQUEST_DURATION.name)},
            Availability(Counted(genai.SERVER_REQUEST_DURATION.count(), ((genai.LABEL_ERROR_TYPE, "!=", ""),)),
                         (Counted(genai.SERVER_REQUEST_DURATION.count()),), (), ((genai.LABEL_ERROR_TYPE, "=", "_OTHER"),)),
            ((genai.LABEL_OPERATION, "=", genai.OPERATION_CHAT), (genai.LABEL_PROVIDER, "=", genai.PROVIDER_OPENAI),
             ("otel_scope_name", "=", "envoyproxy/ai-gateway"))),
    Gateway(SOURCE_DYNAMO, "NVIDIA Dynamo frontend", DYNAMO.LABEL_MODEL,
            {"ttft": Histogram(DYNAMO.TTFT), "itl": Histogram(DYNAMO.ITL), "e2e": Histogram(DYNAMO.DURATION)},
            Availability(Counted(DYNAMO.REQUESTS, ((DYNAMO.LABEL_STATUS, "=", DYNAMO.STATUS_ERROR),) + _DYNAMO_COUNTED),
                         (Counted(DYNAMO.REQUESTS, _DYNAMO_COUNTED),),
                         ((DYNAMO.LABEL_STATUS, "=", DYNAMO.STATUS_SUCCESS), (DYNAMO.LABEL_ERROR_TYPE, "=", "")),
                         ((DYNAMO.LABEL_STATUS, "=", DYNAMO.STATUS_ERROR), (DYNAMO.LABEL_ERROR_TYPE, "=", "internal"))),
            ((DYNAMO.LABEL_ENDPOINT, "=", "chat_completions"), (DYNAMO.LABEL_REQUEST_TYPE, "=", "stream")),
            lowercase_models=True),
)}
GATEWAY_SOURCES = tuple(GATEWAYS)

# Why no gateway can be a goodput source (llmslo/goodput is the tap's): shown where a spec asks for one.
GOODPUT_NOT_FROM_GATEWAYS = (
    "goodput needs each request's TTFT and TPOT judged together (a request is good only if both met the "
    "objective); a gateway's histograms count TTFT and TPOT separately, so no query over them can tell how many "
    "requests met both")
