"""The range of every number the simulator's commands and HTTP API take, each with its reason.

Why bounds: a run holds its requests in memory, so memory follows requests x what each one holds. The
ranges below make the worst case a number (docs/simulator.md, "Input ranges and memory"):

- requests per run: at most MAX_REQUESTS (`--num-requests`, or `--rate` x `--duration`; a plan probe the same);
- a request's memory does not grow with its prompt: generated prompts are a shared prefix plus a run of ids
  (`workload.PromptIds`), and the prefix cache keeps one hash per full block (16 tokens) only while it runs;
- KV blocks: at most MAX_GPU_BLOCKS whatever `--num-gpu-blocks`, `--block-size`, `--tp` derive;
- shared system prompts: at most `--num-prefixes` x the model length, 4 bytes a token.
"""

from __future__ import annotations

from llmslo.argtypes import Bound

MAX_REQUESTS = 1_000_000  # one run's requests (measured: about 1.1 KB each, so 1.1 GB at the cap)
MAX_CONTEXT = 131_072  # the longest context of the presets' models (Llama 3.1: 128 Ki tokens)
MAX_GPU_BLOCKS = 1 << 21  # about 250 bytes of simulator memory each: 0.5 GiB; 32 Mi tokens at block size 16

# Workload (virtual mode, the planner and the load generator).
RATE = Bound(0.001, 100_000.0, "from one request per 1000 s; one replica past 100,000 req/s only queues, and "
             f"rate x duration may not exceed {MAX_REQUESTS:,} requests", words=("inf",))
DURATION = Bound(0.01, 86_400.0, "seconds of arrivals: up to a day of virtual time; rate x duration may not "
                 f"exceed {MAX_REQUESTS:,} requests")
NUM_REQUESTS = Bound(0, MAX_REQUESTS, "a run's requests are held in memory", integer=True)
PROMPT_LEN = Bound(1, MAX_CONTEXT, "no preset's model takes a longer context; draws are clamped to 8x the "
                   "median and to the model length", integer=True)
OUTPUT_LEN = Bound(1, MAX_CONTEXT, "no preset's model takes a longer context; draws are clamped to 10x the "
                   "median and to the model length", integer=True)
SIGMA = Bound(0.0, 3.0, "the lognormal's spread; at 3 most draws already sit at the clamps")
SHARED_PREFIX = Bound(0.0, 1.0, "a fraction of each prompt")
NUM_PREFIXES = Bound(1, 100, "each shared system prompt is held in memory at the longest prompt length",
                     integer=True)
SEED = Bound(0, 2**32 - 1, "32 bits: more reproducible runs than anyone needs", integer=True)

# Engine.
PORT = Bound(0, 65_535, "a TCP port; 0 lets the OS pick", integer=True)
MAX_LORAS = Bound(1, 256, "LoRA slots on one engine (vLLM's default is 1)", integer=True)
TP = Bound(0, 16, "0: the preset's; tensor-parallel GPUs, two nodes of 8 at most", integer=True)
GPU_MEMORY_UTILIZATION = Bound(0.0, 1.0, "0: the preset's (0.9); a share of the GPU's memory")
BLOCK_SIZE = Bound(1, 256, "tokens per KV block; vLLM's run from 1 to 128", integer=True)
NUM_GPU_BLOCKS = Bound(0, MAX_GPU_BLOCKS, "0: derived from the preset; each block costs the simulator about 250 "
                       "bytes, and 2^21 blocks hold more tokens than any preset's GPU", integer=True)
MAX_NUM_SEQS = Bound(1, 65_536, "requests in one batch (vLLM's default is 256)", integer=True)
MAX_NUM_BATCHED_TOKENS = Bound(1, 1 << 20, "tokens in one step (vLLM's default is 2048 with chunked prefill)",
                               integer=True)
MAX_MODEL_LEN = Bound(0, MAX_CONTEXT, "0: the model's; no preset's model takes a longer context", integer=True)
NUM_SCHEDULER_STEPS = Bound(1, 64, "vLLM V0's multi-step scheduling used 8 to 16", integer=True)
OUTPUT_LEN_MEDIAN = Bound(1, MAX_CONTEXT, "no preset's model takes a longer context", integer=True)

# Admission to the HTTP API (`serve`): vLLM's flags, bounded by default (simulator/admission.py). A queued
# request costs about 17 KiB (its handler, connection and state) plus 4 bytes a prompt token, so the defaults
# hold at most some 170 MiB of requests plus 32 MiB of prompt ids waiting for prefill.
DEFAULT_MAX_NUM_QUEUED_REQS = 10_000
DEFAULT_MAX_NUM_QUEUED_TOKENS = 8 * 1024 * 1024
MAX_NUM_QUEUED_REQS = Bound(1, 1_000_000, "requests in flight (waiting or running) before new ones get 503; each "
                            "costs about 17 KiB plus its prompt", integer=True)
MAX_NUM_QUEUED_TOKENS = Bound(1, 1 << 30, "prompt tokens waiting for prefill before new requests get 503; 4 bytes "
                              "each", integer=True)

# Faults (flags and POST /admin/faults).
SLOWDOWN = Bound(0.01, 1000.0, "a factor on every step's time; 1000x already turns a 10 ms step into 10 s")
ERROR_RATE = Bound(0.0, 1.0, "a share of requests")
KV_CAPACITY_FACTOR = Bound(0.01, 1.0, "a share of the KV blocks; at least one block stays usable")
STALL = Bound(0.0, 86_400.0, "seconds from now, up to a day; inf (or true in JSON): until cleared", words=("inf",))

# Goodput thresholds (virtual mode and the load generator).
SLO_SECONDS = Bound(0.0, 3600.0, "seconds; no interactive objective is longer than an hour", low_open=True)

# The planner.
MAX_PLAN_REQUESTS = 10_000_000  # simulated requests in one plan, all presets, seeds and probes: about an hour
PLAN_DURATION = Bound(1.0, 3600.0, "virtual seconds per probe; each probe simulates rate x duration requests, "
                      f"at most {MAX_REQUESTS:,}")
START_RATE = Bound(0.01, 10_000.0, "the search's own floor and ceiling, req/s per replica")
TOLERANCE = Bound(0.001, 0.5, "relative; each halving costs a probe per seed, and below 0.1% seeds differ more "
                  "than that")
TARGET_RATE = Bound(0.001, 1e9, "req/s for the whole pool; replicas = ceil(rate / max rate per replica)")
OBJECTIVE = Bound(0.1, 99.999, "percent good; 100 would let no request miss")
SEEDS = Bound(1, 20, "each seed is a full search of about 10 probes", integer=True)

# The load generator.
CONCURRENCY_LIMIT = Bound(0, 100_000, "0: no cap; requests in flight", integer=True)
TIMEOUT = Bound(0.1, 86_400.0, "seconds per request, up to a day")
