"""GPU and model presets, and the KV-cache capacity they imply.

The numbers are public spec-sheet figures (HBM size, memory bandwidth, dense BF16 tensor throughput) and the
models' published configs (layers, KV heads, head dimension). Capacity follows vLLM's own arithmetic: the KV
cache gets what is left of `HBM x gpu_memory_utilization` after the weights and an activation reserve.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class GpuPreset:
    name: str
    hbm_bytes: int
    mem_bandwidth_bytes_s: float  # HBM bandwidth
    peak_flops: float  # dense BF16 tensor FLOP/s


@dataclass(frozen=True)
class ModelPreset:
    name: str  # the Hugging Face id, served as the model name by default
    params: float  # parameter count
    layers: int
    hidden: int  # query width (heads x head_dim); drives the attention FLOPs
    kv_heads: int
    head_dim: int
    max_model_len: int
    dtype_bytes: int = 2  # BF16 weights and KV cache

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

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
        GpuPreset("H100-80GB", 80 * GIB, 3.35e12, 989e12),
        GpuPreset("H200-141GB", 141 * GIB, 4.8e12, 989e12),
        GpuPreset("A100-80GB", 80 * GIB, 2.04e12, 312e12),
        GpuPreset("A100-40GB", 40 * GIB, 1.56e12, 312e12),
        GpuPreset("L40S-48GB", 48 * GIB, 0.864e12, 362e12),
        GpuPreset("L4-24GB", 24 * GIB, 0.3e12, 121e12),
    )
}

MODELS: dict[str, ModelPreset] = {
    m.name: m
    for m in (
        ModelPreset("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 32, 4096, 8, 128, 8192),
        ModelPreset("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 80, 8192, 8, 128, 8192),
        ModelPreset("mistralai/Mistral-7B-Instruct-v0.3", 7.25e9, 32, 4096, 8, 128, 8192),
        ModelPreset("Qwen/Qwen2.5-7B-Instruct", 7.62e9, 28, 3584, 4, 128, 8192),
    )
}

_LLAMA8 = MODELS["meta-llama/Llama-3.1-8B-Instruct"]
_LLAMA70 = MODELS["meta-llama/Llama-3.1-70B-Instruct"]
_MISTRAL = MODELS["mistralai/Mistral-7B-Instruct-v0.3"]
_QWEN7 = MODELS["Qwen/Qwen2.5-7B-Instruct"]

DEPLOYMENTS: dict[str, Deployment] = {
    d.name: d
    for d in (
        Deployment("llama3-8b-h100", _LLAMA8, GPUS["H100-80GB"]),
        Deployment("llama3-8b-a100", _LLAMA8, GPUS["A100-80GB"]),
        Deployment("llama3-8b-l4", _LLAMA8, GPUS["L4-24GB"], activation_reserve_bytes=2 * GIB),
        Deployment("llama3-70b-h100x4", _LLAMA70, GPUS["H100-80GB"], tp=4),
        Deployment("llama3-70b-h200x2", _LLAMA70, GPUS["H200-141GB"], tp=2),
        Deployment("mistral-7b-a100", _MISTRAL, GPUS["A100-80GB"]),
        Deployment("mistral-7b-l40s", _MISTRAL, GPUS["L40S-48GB"]),
        Deployment("qwen2.5-7b-h100", _QWEN7, GPUS["H100-80GB"]),
    )
}

DEFAULT_DEPLOYMENT = "llama3-8b-h100"


def get_deployment(name: str) -> Deployment:
    try:
        return DEPLOYMENTS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(DEPLOYMENTS)}") from None
