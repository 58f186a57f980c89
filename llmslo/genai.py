"""The OpenTelemetry GenAI semantic convention's server metrics as Prometheus sees them: names, labels, buckets.

Written once here for everything that reads or writes them: the tap's `--genai-names` (exporter/tap/genai.py)
and a gateway SLI source that reads Envoy AI Gateway's series. Prometheus writes an OTel name with `_` for `.`
and the unit's suffix (`gen_ai.server.time_to_first_token`, unit `s` -> `gen_ai_server_time_to_first_token_seconds`),
and each attribute with `_` for `.` (`gen_ai.request.model` -> `gen_ai_request_model`).

Read from (newest each, 2026-08):
- open-telemetry/semantic-conventions at 953276ff (the last commit before the GenAI conventions moved to
  open-telemetry/semantic-conventions-genai in c9e48b1, 2026-05-05): model/gen-ai/metrics.yaml (the server
  metrics, their units and attributes: gen_ai.operation.name and gen_ai.provider.name required,
  gen_ai.request.model and gen_ai.response.model, error.type when the request failed), model/gen-ai/registry.yaml
  (the operation and provider values) and docs/gen-ai/gen-ai-metrics.md (the ExplicitBucketBoundaries).
- envoyproxy/ai-gateway at c217da8 (2026-08-21): internal/metrics/genai.go (the same three histograms, the TTFT
  buckets extended from the convention's 10 s to 60 s) and internal/metrics/metrics_impl.go (every series carries
  operation, provider, request and response model; a failed request's duration gets error.type; a backend of the
  OpenAI schema is provider `openai`).
"""

from __future__ import annotations

from llmslo.conventions import MetricDef

LABEL_OPERATION = "gen_ai_operation_name"
LABEL_PROVIDER = "gen_ai_provider_name"
LABEL_REQUEST_MODEL = "gen_ai_request_model"
LABEL_RESPONSE_MODEL = "gen_ai_response_model"
LABEL_ERROR_TYPE = "error_type"  # only on a failed request's duration: absent, not "", on a good one
LABELS = (LABEL_OPERATION, LABEL_PROVIDER, LABEL_REQUEST_MODEL, LABEL_RESPONSE_MODEL)

OPERATION_CHAT = "chat"  # POST /v1/chat/completions
OPERATION_TEXT_COMPLETION = "text_completion"  # POST /v1/completions (Envoy AI Gateway writes "completion")
PROVIDER_OPENAI = "openai"  # what Envoy AI Gateway writes for a backend speaking the OpenAI API

SERVER_TTFT = MetricDef(
    "gen_ai_server_time_to_first_token_seconds", "histogram",
    "Time to generate first token for successful responses (OpenTelemetry GenAI).", LABELS, "seconds",
)
SERVER_TPOT = MetricDef(
    "gen_ai_server_time_per_output_token_seconds", "histogram",
    "Time per output token generated after the first token for successful responses (OpenTelemetry GenAI).",
    LABELS, "seconds",
)
SERVER_REQUEST_DURATION = MetricDef(
    "gen_ai_server_request_duration_seconds", "histogram",
    "Generative AI server request duration such as time-to-last byte or last output token (OpenTelemetry GenAI).",
    LABELS + (LABEL_ERROR_TYPE,), "seconds",
)
METRICS = (SERVER_TTFT, SERVER_TPOT, SERVER_REQUEST_DURATION)

# Bucket edges, seconds. TTFT: the convention's up to 10 s, then Envoy AI Gateway's extension to 60 s.
TTFT_EDGES = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    15.0, 20.0, 30.0, 45.0, 60.0,
)
TPOT_EDGES = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
REQUEST_DURATION_EDGES = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
