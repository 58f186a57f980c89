"""GPU and model presets, and the KV-cache capacity they imply.

The numbers are public spec-sheet figures (HBM size, memory bandwidth, dense BF16 tensor throughput, NVLink or
PCIe bandwidth) and the models' published configs (layers, KV heads, head dimension, vocabulary). Capacity
follows vLLM's own arithmetic: the KV cache gets what is left of `HBM x gpu_memory_utilization` after the
weights and an activation reserve.

Speed needs two measured efficiencies per GPU, the share of peak a real kernel reaches:
- A100: Vidur's published A100 profile of Llama-3-8B's 32 layers of linear operators: 9.8 ms for one token
  (13.96 GB of weights: 1.42 TB/s, 0.70 of 2.04 TB/s) and 146 ms for 2048 tokens (28.6 TFLOP: 196 TFLOP/s, 0.63
  of 312). The A100-40GB shares the matmul figure; its HBM2 is slower (1.56 TB/s) while the SMs that stream the
  weights are the same, so the 1.42 TB/s they reach on the 80 GB part would be 0.91 of its peak: 0.85 is used
  (a single-request vLLM 0.23 sweep on one A100-40GB, 13.3 ms per token, agrees within 3%).
- Hopper (H100, H200): 0.80 of HBM bandwidth (small-batch decode of Llama-3-8B: the v0.6.0 blog's 8.7 ms TPOT at
  QPS 2 on H100, vLLM CI's 833 ms for 128 tokens at batch 8 on H200) and 0.50 of the dense BF16 peak (prefill:
  Hopper's GEMMs at a few thousand tokens reach about half of 989 TFLOP/s, the blog's prefill-heavy throughput).
- Ada (L40S, L4): no published vLLM profile; Ampere's efficiencies are assumed (docs/simulator.md says so).
All-reduce across the tensor-parallel group uses the GPU's interconnect: NVLink's all-reduce bus bandwidth as
nccl-tests report it (about 80 % of the per-direction link rate) and a small-message latency of ~10 us.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class CostParams:
    """The engine's own overheads (not the GPU's): the same on every GPU preset unless a deployment brings its
    own (the CPU preset, whose engine runs eagerly on one core)."""

    step_overhead_s: float = 0.0008  # scheduler, input preparation, CUDA-graph launch: once per step
    layer_overhead_s: float = 0.000050  # per layer: the small non-GEMM kernels' launch and run time
    per_seq_overhead_s: float = 0.000004  # sampling and output processing, per scheduled sequence
    frontend_latency_s: float = 0.035  # API server: parse, tokenize, hand to the engine core


@dataclass(frozen=True)
class GpuPreset:
    name: str
    hbm_bytes: int
    mem_bandwidth_bytes_s: float  # HBM bandwidth
    peak_flops: float  # dense BF16 tensor FLOP/s
    bandwidth_efficiency: float  # share of peak HBM bandwidth that weight-streaming GEMMs and KV reads reach
    matmul_efficiency: float  # share of peak FLOP/s that large (prefill) GEMMs and attention reach
    link_bandwidth_bytes_s: float  # all-reduce bus bandwidth between GPUs of one TP group
    link_latency_s: float  # one small all-reduce


@dataclass(frozen=True)
class ModelPreset:
    name: str  # the Hugging Face id, served as the model name by default
    params: float  # parameter count
    layers: int
    hidden: int  # query width (heads x head_dim); drives the attention FLOPs
    kv_heads: int
    head_dim: int
    max_model_len: int
    vocab: int  # the embedding's and the LM head's rows
    tied_embeddings: bool = False  # one matrix for the embedding and the LM head
    dtype_bytes: int = 2  # BF16 weights and KV cache

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def head_params(self) -> float:
        """The LM head: vocab x hidden, run only for the positions that sample a token."""
        return self.vocab * self.hidden

    @property
    def layer_params(self) -> float:
        """The transformer layers' weights: all but the embedding (a lookup) and the LM head."""
        return self.params - self.head_params * (1 if self.tied_embeddings else 2)

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """K and V for every layer, per GPU: layers x kv_heads x head_dim x 2 x dtype_bytes / tp."""
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes / tp


@dataclass(frozen=True)
class Deployment:
    """One model served on `tp` GPUs of one kind: what capacity and speed derive from."""

    name: str
    model: ModelPreset
    gpu: GpuPreset
    tp: int = 1
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 4 * GIB  # per GPU: activations, CUDA graphs, sampler buffers
    cost_params: CostParams | None = None  # None: the engine overheads measured on GPUs (CostParams())

    def num_gpu_blocks(self, block_size: int) -> int:
        """KV blocks: (HBM x utilization - weights/tp - activation reserve) / (KV bytes/token x block_size)."""
        budget = self.gpu.hbm_bytes * self.gpu_memory_utilization
        budget -= self.model.weight_bytes / self.tp + self.activation_reserve_bytes
        per_block = self.model.kv_bytes_per_token(self.tp) * block_size
        if budget < per_block:
            raise ValueError(
                f"preset {self.name!r}: the weights ({self.model.weight_bytes / self.tp / GIB:.1f} GiB per GPU) "
                f"leave no room for a KV cache on {self.gpu.name} at gpu_memory_utilization="
                f"{self.gpu_memory_utilization}; raise --tp or --gpu-memory-utilization"
            )
        return int(budget // per_block)


GPUS: dict[str, GpuPreset] = {
    g.name: g
    for g in (
        # name, HBM, bandwidth, BF16 peak, bandwidth and matmul efficiency, link bus bandwidth and latency
        GpuPreset("H100-80GB", 80 * GIB, 3.35e12, 989e12, 0.80, 0.46, 360e9, 10e-6),  # NVLink 4: 450 GB/s/dir
        GpuPreset("H200-141GB", 141 * GIB, 4.8e12, 989e12, 0.80, 0.46, 360e9, 10e-6),
        GpuPreset("A100-80GB", 80 * GIB, 2.04e12, 312e12, 0.70, 0.63, 240e9, 10e-6),  # NVLink 3: 300 GB/s/dir
        GpuPreset("A100-40GB", 40 * GIB, 1.56e12, 312e12, 0.85, 0.63, 240e9, 10e-6),  # HBM2: see above
        GpuPreset("L40S-48GB", 48 * GIB, 0.864e12, 362e12, 0.70, 0.63, 25e9, 20e-6),  # PCIe 4.0 x16
        GpuPreset("L4-24GB", 24 * GIB, 0.3e12, 121e12, 0.70, 0.63, 25e9, 20e-6),
        # Not a GPU: one core of this project's 2-core test machine running vLLM's CPU build with one OpenMP
        # thread (the real-engine tier). "HBM" is the KV space vLLM is given (VLLM_CPU_KVCACHE_SPACE=1 GiB) plus
        # the weights; bandwidth and FLOP/s are what vLLM's own prefill and inter-token histograms measured
        # (bench/sim_vs_vllm.py --calibrate), so the efficiencies are 1.
        GpuPreset("CPU-1-thread", GIB + 15_000_000, 15e9, 140e9, 1.0, 1.0, 10e9, 10e-6),
    )
}

MODELS: dict[str, ModelPreset] = {
    m.name: m
    for m in (
        ModelPreset("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 32, 4096, 8, 128, 8192, 128256),
        ModelPreset("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 80, 8192, 8, 128, 8192, 128256),
        ModelPreset("mistralai/Mistral-7B-Instruct-v0.3", 7.25e9, 32, 4096, 8, 128, 8192, 32768),
        ModelPreset("Qwen/Qwen2.5-7B-Instruct", 7.62e9, 28, 3584, 4, 128, 8192, 152064),
        # realengine/build_model.py's random-weight Llama: 4 layers of hidden 256 (4 heads of 64, MLP 512), a tied
        # 4096-word embedding, float32: 4 x (4 x 256^2 + 3 x 256 x 512 + 2 x 256) + 256 + 4096 x 256 parameters.
        ModelPreset("tiny-llama", 3_672_320, 4, 256, 4, 64, 2048, 4096, tied_embeddings=True, dtype_bytes=4),
    )
}

_LLAMA8 = MODELS["meta-llama/Llama-3.1-8B-Instruct"]
_LLAMA70 = MODELS["meta-llama/Llama-3.1-70B-Instruct"]
_MISTRAL = MODELS["mistralai/Mistral-7B-Instruct-v0.3"]
_QWEN7 = MODELS["Qwen/Qwen2.5-7B-Instruct"]
_TINY = MODELS["tiny-llama"]

# The CPU engine's own overheads, fitted to vLLM 0.32's CPU build (eager mode, one OpenMP thread) on the lowest of
# three measurements per point while the 2-core machine was shared (docs/simulator.md, "The simulator against
# vLLM's own scheduler"): 1.5 ms per step (Python scheduling, input preparation, eager kernel launches), 70 us per
# sequence (sampling, output processing), and 13.6 ms from the client to the engine core and back (the median of
# lone requests' client TTFT less vLLM's engine-side prefill and queue time).
CPU_ENGINE = CostParams(step_overhead_s=0.0015, layer_overhead_s=0.0, per_seq_overhead_s=0.00007,
                        frontend_latency_s=0.0136)

DEPLOYMENTS: dict[str, Deployment] = {
    d.name: d
    for d in (
        Deployment("llama3-8b-h100", _LLAMA8, GPUS["H100-80GB"]),
        Deployment("llama3-8b-a100", _LLAMA8, GPUS["A100-80GB"]),
        Deployment("llama3-8b-a100-40gb", _LLAMA8, GPUS["A100-40GB"]),
        Deployment("llama3-8b-h200", _LLAMA8, GPUS["H200-141GB"]),
        Deployment("llama3-8b-l4", _LLAMA8, GPUS["L4-24GB"], activation_reserve_bytes=2 * GIB),
        Deployment("llama3-70b-h100x4", _LLAMA70, GPUS["H100-80GB"], tp=4),
        Deployment("llama3-70b-h200x2", _LLAMA70, GPUS["H200-141GB"], tp=2),
        Deployment("mistral-7b-a100", _MISTRAL, GPUS["A100-80GB"]),
        Deployment("mistral-7b-l40s", _MISTRAL, GPUS["L40S-48GB"]),
        Deployment("qwen2.5-7b-h100", _QWEN7, GPUS["H100-80GB"]),
        Deployment("tiny-llama-cpu", _TINY, GPUS["CPU-1-thread"], gpu_memory_utilization=1.0,
                   activation_reserve_bytes=0, cost_params=CPU_ENGINE),
    )
}

DEFAULT_DEPLOYMENT = "llama3-8b-h100"


def get_deployment(name: str) -> Deployment:
    try:
        return DEPLOYMENTS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(DEPLOYMENTS)}") from None
