"""The engine sample pages in ../shared (developer data), each with the engine kind it comes from."""

from pathlib import Path

SHARED_PAGES = Path(__file__).resolve().parents[2] / ".." / "shared" / "peers" / "engine-metrics"

SAMPLE_PAGES = {
    "vllm-v1.prom": "vllm",
    "vllm-v1-0.10-transition.prom": "vllm",
    "vllm-v0-legacy.prom": "vllm",
    "sglang.prom": "sglang",
    "sglang-legacy-docs.prom": "sglang",
    "tgi.prom": "tgi",
    "triton-trtllm.prom": "trtllm-triton",
    "triton-trtllm-extended.prom": "trtllm-triton",
    "trtllm-serve.prom": "trtllm-serve",
}
