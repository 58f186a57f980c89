"""The synthetic fleet the generated dashboard tests run on: its input series and the facts answers derive from.

Why synthetic and this shape: dashboard defects hide in a fleet that is too uniform (one engine kind, every
outcome ok, one block size). This one mixes what breaks panels: three engine kinds with
their real latency bucket edges (llmslo/bucket_edges.py; vLLM and SGLang twice, once as static targets with
no pod), taps whose classes see every kind of outcome (neutral ones included), a class with no request within
its objectives (no goodput series at all), two KV block sizes, an engine without a block size, two nodes.
All rates are whole requests (or tokens) per second, so every answer is exact in binary floating point and
promtool, which compares floats exactly, can hold the dashboards to the value derived here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from llmslo import bucket_edges as be
from llmslo import conventions as c
from llmslo.conventions import CAPACITY as K
from llmslo.gofloat import client_float

CLUSTER = "east"
STEP_S = 60  # one sample a minute
EVAL_MIN = 10  # the fleet tests evaluate at 10m, over a 5m rate interval (samples 0..10m)
RATE_INTERVAL = "5m"

Dist = tuple[tuple[float, int], ...]  # (latency in seconds, requests per second at it)


@dataclass(frozen=True)
class Engine:
    kind: str  # the `engine` label (bucket_edges kinds)
    pod: str  # "" for a static target (no pod, no namespace)
    namespace: str
    node: str
    model: str
    block_size: int  # tokens per KV block; 0: the engine publishes none
    free_blocks: int
    usage: float
    waiting: int
    running: int
    ttft: Dist = ()
    tpot: Dist = ()
    itl: Dist = ()
    e2e: Dist = ()
    finished: tuple[tuple[str, int], ...] = ()  # finished reason -> per second
    prompt_tps: int = 0
    generation_tps: int = 0
    preemptions: int = 0  # per second
    prefix: tuple[int, int] | None = None  # (hits, queries) tokens per second; None: not published
    lora: tuple[int, int, int] | None = None  # (running, waiting, slots); None: not published
    rejected: tuple[tuple[str, int], ...] = ()  # the engine's refusal reason -> per second
    waiting_by: tuple[tuple[str, int], ...] = ()  # why requests wait -> how many (adding up to `waiting`)

    def labels(self) -> dict[str, str]:
        out = {c.LABEL_ENGINE: self.kind, c.LABEL_MODEL: self.model, c.LABEL_POD: self.pod,
               c.LABEL_NAMESPACE: self.namespace, c.LABEL_NODE: self.node, c.LABEL_CLUSTER: CLUSTER}
        return {k: v for k, v in out.items() if v}  # Prometheus has no empty labels

    def edges(self, metric: str) -> tuple[float, ...]:
        """This kind's real edges for a latency metric (the newest row of the table)."""
        return be.rows([self.kind], metric)[0].edges[metric]


@dataclass(frozen=True)
class TapClass:
    """One tap's series of one (model, class): outcomes, goodput, tokens, client-side latencies."""

    pod: str
    node: str
    model: str
    slo_class: str
    outcomes: tuple[tuple[str, int], ...]  # outcome -> per second
    goodput: int  # requests per second within both objectives; 0: the tap never created the series
    output_tps: int
    goodput_tps: int
    ttft: Dist = ()
    tpot: Dist = ()
    e2e: Dist = ()

    def labels(self) -> dict[str, str]:
        return {c.LABEL_ENGINE: "tap", c.LABEL_MODEL: self.model, c.LABEL_SLO_CLASS: self.slo_class,
                c.LABEL_POD: self.pod, c.LABEL_NAMESPACE: "llm", c.LABEL_NODE: self.node, c.LABEL_CLUSTER: CLUSTER}


@dataclass(frozen=True)
class Gpu:
    hostname: str
    index: str
    used: int
    total: int
    pod: str = ""  # the holder, as the kubelet's pod-resources mapping names it; "" for an idle GPU (labels empty)
    namespace: str = ""

    def labels(self) -> dict[str, str]:
        owner = {c.LABEL_POD: self.pod, c.LABEL_NAMESPACE: self.namespace, c.LABEL_CONTAINER: "main"} if self.pod else {}
        return {c.LABEL_GPU: self.index, c.LABEL_UUID: f"GPU-{self.hostname}-{self.index}",
                c.LABEL_MODEL_NAME: "NVIDIA H100 80GB HBM3", c.LABEL_PCI_BUS_ID: f"00000000:1{self.index}:00.0",
                c.LABEL_HOSTNAME: self.hostname, c.LABEL_CLUSTER: CLUSTER, **owner}


@dataclass(frozen=True)
class Fleet:
    engines: tuple[Engine, ...]
    taps: tuple[TapClass, ...]
    gpus: tuple[Gpu, ...]
    seats_p99: dict[str, int] = field(default_factory=dict)  # engine pod-or-model key -> recorded seats
    pool_seats: dict[tuple[str, str], tuple[int, int, int | None]] = field(default_factory=dict)
    # (namespace, model) -> (p99 seats, p50 seats, minutes to exhaustion or None)
    node_pools: dict[str, str] = field(default_factory=dict)  # hostname -> the pool its exporter says (--node-pool)
    tap_refusals: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (pod, node, reason) -> per second


GB = 1_000_000_000
FLEET = Fleet(
    engines=(
        Engine("vllm", "vllm-0", "llm", "node-a", "llama-3-8b", 16, 2000, 0.5, 2, 8,
               ttft=((0.07, 32), (0.2, 8), (0.6, 8), (1.8, 16)), tpot=((0.02, 32), (0.045, 16), (0.09, 16)),
               itl=((0.02, 64), (0.06, 32)), e2e=((0.7, 32), (2.2, 16), (8.0, 16)),
               finished=((c.FINISHED_STOP, 40), (c.FINISHED_LENGTH, 8), (c.FINISHED_ABORT, 2)),
               prompt_tps=4096, generation_tps=2048, preemptions=1, prefix=(320, 1024), lora=(2, 1, 4),
               rejected=(("max_num_queued_reqs", 2), ("max_num_queued_tokens", 1)),
               waiting_by=(("capacity", 1), ("deferred", 1))),
        Engine("sglang", "sglang-0", "llm", "node-b", "llama-3-8b", 64, 900, 0.75, 1, 6,
               ttft=((0.15, 20), (0.5, 12), (1.3, 8), (7.0, 8)), tpot=((0.018, 24), (0.05, 8), (0.3, 8)),
               itl=((0.012, 48), (0.03, 16)), e2e=((1.5, 24), (5.0, 8), (30.0, 8)),
               finished=((c.FINISHED_COMPLETED, 32), (c.FINISHED_ERROR, 2)),
               prompt_tps=4096, generation_tps=2048, prefix=(512, 1024), waiting_by=(("capacity", 1), ("deferred", 0))),
        Engine(c.ENGINE_TRTLLM_TRITON, "triton-0", "llm", "node-b", "mixtral-8x7b", 0, 0, 0.25, 0, 3,
               ttft=((0.3, 8), (1.0, 4), (3.0, 4)), finished=((c.FINISHED_COMPLETED, 16),),
               prompt_tps=2048, generation_tps=1024),
        # Static targets: no pod, no namespace; only node, kind and model tell them apart.
        Engine("vllm", "", "", "node-a", "qwen-7b", 16, 400, 0.9, 5, 10,
               ttft=((0.3, 8), (0.9, 4), (3.0, 4)), tpot=((0.03, 12), (0.2, 4)),
               finished=((c.FINISHED_STOP, 24),), prompt_tps=1024, generation_tps=512, preemptions=2,
               prefix=(0, 128), lora=(0, 0, 2)),
        Engine("sglang", "", "", "node-b", "qwen-7b", 32, 100, 0.95, 4, 9,
               ttft=((0.35, 8), (2.5, 8)), tpot=((0.07, 16),),
               finished=((c.FINISHED_COMPLETED, 16), (c.FINISHED_ABORT, 2)), prompt_tps=1024, generation_tps=256),
    ),
    taps=(
        TapClass("vllm-0", "node-a", "llama-3-8b", "interactive",
                 ((c.OUTCOME_OK, 40), (c.OUTCOME_UPSTREAM_ERROR, 2), (c.OUTCOME_CLIENT_DISCONNECTED, 6),
                  (c.OUTCOME_CLIENT_ERROR, 2)), 32, 4096, 3072,
                 ttft=((0.12, 20), (0.4, 12), (0.9, 8)), tpot=((0.018, 24), (0.035, 8), (0.09, 8)),
                 e2e=((1.2, 32), (4.0, 8))),
        TapClass("sglang-0", "node-b", "llama-3-8b", "interactive",
                 ((c.OUTCOME_OK, 20), (c.OUTCOME_ABORTED, 2), (c.OUTCOME_CLIENT_GAVE_UP, 2)), 16, 2048, 1536,
                 ttft=((0.08, 12), (0.3, 4), (0.6, 4)), tpot=((0.015, 16), (0.06, 4)), e2e=((0.9, 16), (2.5, 4))),
        # Every batch request too slow or failing: no goodput series at all; some hang until the tap's deadline
        # (upstream_timeout: in no latency histogram, only in the late-requests panels).
        TapClass("vllm-0", "node-a", "batch-mixtral", "batch",
                 ((c.OUTCOME_OK, 10), (c.OUTCOME_UPSTREAM_ERROR, 6), (c.OUTCOME_CLIENT_DISCONNECTED, 2),
                  (c.OUTCOME_UPSTREAM_TIMEOUT, 4)), 0, 3072, 0,
                 ttft=((6.5, 6), (12.0, 4)), tpot=((0.2, 10),), e2e=((40.0, 10),)),
    ),
    # node-c: a training node; its GPU held by a training pod (the GPUs-by-pool panel)
    gpus=(Gpu("node-a", "0", 60 * GB, 80 * GB, "vllm-0", "llm"), Gpu("node-a", "1", 20 * GB, 80 * GB),
          Gpu("node-b", "0", 76 * GB, 80 * GB, "sglang-0", "llm"), Gpu("node-c", "0", 70 * GB, 80 * GB, "finetune-0", "train")),
    node_pools={"node-a": "inference", "node-b": "inference", "node-c": "training"},
    seats_p99={"vllm-0": 15, "sglang-0": 28, "qwen-7b/vllm": 3, "qwen-7b/sglang": 2},
    pool_seats={("llm", "llama-3-8b"): (43, 90, 30), ("", "qwen-7b"): (5, 12, None)},
    tap_refusals={("vllm-0", "node-a", c.REFUSED_ADMISSION_TTFT): 4, ("vllm-0", "node-a", c.REFUSED_CONNECTION_LIMIT): 1},
)


# --------------------------------------------------------------------------------------
# Facts: what the fleet is, in numbers (the answers' inputs)
# --------------------------------------------------------------------------------------
def cumulative(dist: Dist, edges: tuple[float, ...]) -> list[tuple[float, int]]:
    """(edge, requests per second at or under it) for every edge and +Inf: the histogram's buckets."""
    out = [(e, sum(n for v, n in dist if v <= e)) for e in edges]
    return out + [(float("inf"), sum(n for _, n in dist))]


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """The q-quantile of one ladder's cumulative buckets (+Inf last), as a histogram estimates it: linear
    within the bucket that holds the rank (the arithmetic of Prometheus' promql/quantile.go, step for step,
    so the float is the same)."""
    rank = q * buckets[-1][1]
    b = next(i for i, (_, n) in enumerate(buckets[:-1] + [(0.0, float("inf"))]) if n >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def merge(dists: list[Dist]) -> Dist:
    return tuple(pair for d in dists for pair in d)


def tap_edges(metric: str) -> tuple[float, ...]:
    """The tap's default ladder for `ttft`/`tpot`/`e2e` (the SLO thresholds it adds change no answer here)."""
    return be.TAP_TPOT_LADDER if metric == "tpot" else be.TAP_LATENCY_LADDER


# The histogram each side writes a latency to (as llmslo/latency's `metric` option names it).
ENGINE_HISTOGRAMS = {"ttft": c.TTFT, "tpot": c.TPOT, "itl": c.ITL, "e2e": c.E2E}
TAP_HISTOGRAMS = {"ttft": c.TAP_TTFT, "tpot": c.TAP_TPOT, "e2e": c.TAP_E2E}


def fleet_for(classes: set[str], f: Fleet = FLEET) -> Fleet:
    """The fleet with a tap class for each of `classes` (the SLOs' own): one not in it gets a copy of the
    first class's taps, so every class-scoped panel has data."""
    template = f.taps[0].slo_class
    extra = sorted(classes - {t.slo_class for t in f.taps})
    return replace(f, taps=f.taps + tuple(replace(t, slo_class=k) for k in extra for t in f.taps if t.slo_class == template))


def tap_refusal_labels(pod: str, node: str, reason: str) -> dict[str, str]:
    """A tap sidecar's refusal series as the node exporter passes it through: the pod's identity, engine="tap"."""
    return {c.LABEL_ENGINE: c.ENGINE_TAP, c.LABEL_MODEL: "llama-3-8b", c.LABEL_POD: pod, c.LABEL_NAMESPACE: "llm",
            c.LABEL_NODE: node, c.LABEL_CLUSTER: CLUSTER, c.LABEL_REASON: reason}


def engine_key(e: Engine) -> str:
    return e.pod or f"{e.model}/{e.kind}"


# --------------------------------------------------------------------------------------
# Input series (promtool's `input_series`)
# --------------------------------------------------------------------------------------
def exact_rate(per_s: float) -> bool:
    """Whether promtool's rate() returns this per-second rate exactly: 0 or m x 2^k with m in {1, 1.25, 1.5}.

    rate() scales a window's increase by fixed factors; promtool 2.42 returns 2000.0000000000002 for a counter
    rising 2000 a second, and exactly 1, 3 and 5 (so every power-of-two multiple of them: their mantissas)."""
    if per_s == 0:
        return True
    mantissa, _ = math.frexp(per_s)
    return mantissa * 2 in (1.0, 1.25, 1.5)


def counter(per_s: float, minutes: int = EVAL_MIN) -> str:
    if not exact_rate(per_s):
        raise ValueError(f"synthetic rate {per_s:g}/s is not one promtool computes exactly: use 0 or m x 2^k, m in 1, 3, 5")
    return f"0+{client_float(per_s * STEP_S).removesuffix('.0')}x{minutes}"


def gauge(value: float, minutes: int = EVAL_MIN) -> str:
    text = client_float(value)
    return f"{text.removesuffix('.0') if text.endswith('.0') else text}x{minutes}"


def _histogram(metric: c.MetricDef, labels: dict[str, str], dist: Dist, edges: tuple[float, ...]) -> list:
    return [(metric.bucket(), {**labels, c.LABEL_LE: "+Inf" if e == float("inf") else client_float(e)}, counter(n))
            for e, n in cumulative(dist, edges)] + [(metric.count(), labels, counter(sum(n for _, n in dist)))]


def fleet_series(f: Fleet = FLEET) -> list[tuple[str, dict[str, str], str]]:
    out: list[tuple[str, dict[str, str], str]] = []
    for e in f.engines:
        lb = e.labels()
        out += [(c.KV_CACHE_USAGE.name, lb, gauge(e.usage)), (c.REQUESTS_WAITING.name, lb, gauge(e.waiting)),
                (c.REQUESTS_RUNNING.name, lb, gauge(e.running)),
                (c.PROMPT_TOKENS.name, lb, counter(e.prompt_tps)), (c.GENERATION_TOKENS.name, lb, counter(e.generation_tps)),
                (c.PREEMPTIONS.name, lb, counter(e.preemptions))]
        if e.block_size:
            out += [(c.KV_BLOCKS_FREE.name, lb, gauge(e.free_blocks)), (c.KV_BLOCK_SIZE.name, lb, gauge(e.block_size))]
        out += [(c.REQUESTS_FINISHED.name, {**lb, c.LABEL_REASON: r}, counter(n)) for r, n in e.finished]
        if e.prefix:
            out += [(c.PREFIX_CACHE_HITS.name, lb, counter(e.prefix[0])), (c.PREFIX_CACHE_QUERIES.name, lb, counter(e.prefix[1]))]
        out += [(c.REQUESTS_REJECTED.name, {**lb, c.LABEL_REASON: r}, counter(n)) for r, n in e.rejected]
        out += [(c.REQUESTS_WAITING_BY_REASON.name, {**lb, c.LABEL_REASON: r}, gauge(n)) for r, n in e.waiting_by]
        if e.lora:
            out += [(c.LORA_ADAPTERS_RUNNING.name, lb, gauge(e.lora[0])), (c.LORA_ADAPTERS_WAITING.name, lb, gauge(e.lora[1])),
                    (c.LORA_ADAPTERS_MAX.name, lb, gauge(e.lora[2]))]
        for name, metric in ENGINE_HISTOGRAMS.items():
            if getattr(e, name):
                out += _histogram(metric, lb, getattr(e, name), e.edges(name))
        seats = f.seats_p99.get(engine_key(e))
        if seats is not None:
            out.append((K.SEATS_P99, {k: lb[k] for k in K.ENGINE_LABELS if k in lb}, gauge(seats)))
    for t in f.taps:
        lb = t.labels()
        out += [(c.TAP_REQUESTS.name, {**lb, c.LABEL_OUTCOME: o}, counter(n)) for o, n in t.outcomes]
        if t.goodput:
            out.append((c.GOODPUT_REQUESTS.name, lb, counter(t.goodput)))
            out.append((c.GOODPUT_TOKENS.name, {**lb, c.LABEL_USAGE_SOURCE: c.USAGE_SOURCE_ENGINE}, counter(t.goodput_tps)))
        out.append((c.OUTPUT_TOKENS.name, {**lb, c.LABEL_USAGE_SOURCE: c.USAGE_SOURCE_ENGINE}, counter(t.output_tps)))
        for name, metric in TAP_HISTOGRAMS.items():
            if getattr(t, name):
                out += _histogram(metric, lb, getattr(t, name), tap_edges(name))
    out += [(c.TAP_REFUSALS.name, tap_refusal_labels(pod, node, reason), counter(n))
            for (pod, node, reason), n in f.tap_refusals.items()]
    for g in f.gpus:
        lb = g.labels()
        out += [(c.GPU_MEMORY_USED.name, lb, gauge(g.used)), (c.GPU_MEMORY_TOTAL.name, lb, gauge(g.total)),
                (c.GPU_MEMORY_FREE.name, lb, gauge(g.total - g.used))]
    out += [(c.EXPORTER_NODE_POOL_INFO.name, {c.LABEL_HOSTNAME: host, c.LABEL_NODE_POOL: pool, c.LABEL_CLUSTER: CLUSTER},
             gauge(1)) for host, pool in f.node_pools.items()]
    for (ns, model), (p99, p50, minutes) in f.pool_seats.items():
        lb = {k: v for k, v in {c.LABEL_CLUSTER: CLUSTER, c.LABEL_NAMESPACE: ns, c.LABEL_MODEL: model}.items() if v}
        out += [(K.POOL_SEATS_P99, lb, gauge(p99)), (K.POOL_SEATS_P50, lb, gauge(p50))]
        if minutes is not None:
            out.append((K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION, lb, gauge(minutes)))
    return out
