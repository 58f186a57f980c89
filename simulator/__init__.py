"""Engine simulator: an OpenAI-compatible streaming server with continuous batching, a paged KV cache and vLLM metrics."""
