"""The engine's knobs in one typed place, with vLLM's names so a reader can map them onto a real deployment."""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.limits import MAX_GPU_BLOCKS
from simulator.presets import DEFAULT_DEPLOYMENT, Deployment, get_deployment

BATCHING_MODES = ("continuous", "static")


@dataclass(frozen=True)
class EngineConfig:
    deployment: Deployment = field(default_factory=lambda: get_deployment(DEFAULT_DEPLOYMENT))
    served_model_name: str = ""  # empty: the preset model's Hugging Face id
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    # vLLM V0's knobs, to replay benchmarks of V0 releases (e.g. the v0.6.0 blog): prompts whole in prefill-only
    # steps that go before any decode (--no-chunked-prefill), and new requests joining only every N steps
    # (--num-scheduler-steps, V0's multi-step scheduling). The defaults are V1's.
    chunked_prefill: bool = True
    num_scheduler_steps: int = 1
    # V0's asynchronous output processing (vLLM 0.6.0, PRs 7049/7921/8050, on by default there): a step's outputs
    # are processed while the next step runs, so its tokens and finishes reach clients when that next step ends
    # (at once if nothing runs next). V1 hands them over as the step ends (False).
    async_output_proc: bool = False
    max_model_len: int = 0  # 0: the model preset's context length
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int = 0  # 0: derive from the preset's HBM arithmetic
    batching: str = "continuous"  # continuous | static
    lora_adapters: tuple[str, ...] = ()
    max_loras: int = 1
    # Natural output length when a request does not set ignore_eos: lognormal around this median.
    output_len_median: int = 150
    output_len_sigma: float = 0.6
    seed: int = 0
    engine_index: str = "0"  # vLLM's `engine` label

    def __post_init__(self) -> None:
        def need(ok: bool, flag: str, fix: str) -> None:
            if not ok:
                raise ValueError(f"engine config: {flag} {fix}")

        need(self.block_size > 0, "--block-size", "must be a positive number of tokens")
        need(self.max_num_seqs > 0, "--max-num-seqs", "must be at least 1")
        need(self.max_num_batched_tokens > 0, "--max-num-batched-tokens", "must be at least 1")
        need(1 <= self.num_scheduler_steps <= 64, "--num-scheduler-steps", "must be from 1 to 64")
        need(self.chunked_prefill or self.batching == "continuous", "--no-chunked-prefill",
             "applies to --batching continuous only")
        need(self.max_model_len >= 0, "--max-model-len", "must be >= 0 (0 = the preset's)")
        need(self.num_gpu_blocks_override >= 0, "--num-gpu-blocks", "must be >= 0 (0 = derive from the preset)")
        need(self.batching in BATCHING_MODES, "--batching", f"must be one of {', '.join(BATCHING_MODES)}")
        need(self.max_loras >= 1, "--max-loras", "must be at least 1")
        need(self.output_len_median >= 1, "--output-len-median", "must be at least 1")
        need(len(set(self.lora_adapters)) == len(self.lora_adapters), "--lora", "names an adapter twice")
        blocks = self.num_gpu_blocks  # derived from the preset unless overridden: bounded either way (memory)
        need(blocks <= MAX_GPU_BLOCKS, "--num-gpu-blocks",
             f"(or what --block-size {self.block_size}, --tp and --gpu-memory-utilization derive: {blocks:,}) must "
             f"be at most {MAX_GPU_BLOCKS:,} blocks, about 250 bytes of simulator memory each; raise --block-size")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.deployment.model.name

    @property
    def model_len(self) -> int:
        return self.max_model_len or self.deployment.model.max_model_len

    @property
    def num_gpu_blocks(self) -> int:
        return self.num_gpu_blocks_override or self.deployment.num_gpu_blocks(self.block_size)
