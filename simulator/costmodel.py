"""How long one engine step takes, from the GPU's measured speeds and what the step computes.

A step runs every scheduled token through the model once. Its time is the sum of what cannot overlap:

  linear     = max(linear FLOPs / (tp x peak FLOP/s x matmul efficiency),
                   weight bytes / tp / (HBM bandwidth x bandwidth efficiency))
  attention  = attention FLOPs / (tp x peak x matmul efficiency) + KV bytes read / (HBM x bandwidth efficiency)
  all-reduce = 2 per layer with tp > 1: link latency + activation bytes x 2 (tp-1)/tp / link bandwidth
  fixed      = per-step CPU overhead + per-layer small kernels (norms, rotary, activation, launches)
  per seq    = sampling and output processing, per scheduled sequence

The linear layers (QKV, output, MLP, LM head) are one GEMM per weight for the whole batch, so reading a weight
overlaps with multiplying by it: a roofline, per step. Attention is a separate kernel per layer that reads each
sequence's own KV cache, so in a mixed step the decode sequences' KV reads add to the prefill's GEMM time
rather than hiding behind it. The LM head runs only for sequences that sample a token this step (vLLM computes
logits for the last position of each), not for every prompt token; the embedding is a row lookup (no FLOPs).

The efficiencies are the GPU preset's (measured: Vidur's A100 kernel profile, see presets.py); the overheads
below are the engine's, the same on every GPU. docs/simulator.md states the error against published vLLM runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.presets import CostParams, Deployment

__all__ = ["CostModel", "CostParams", "StepShape"]


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a step computes. `context_tokens` sums, over sequences, the KV positions attention reads."""

    num_tokens: int  # tokens run through the model (prefill chunks + one per decoding sequence)
    num_seqs: int
    context_tokens: int
    attention_pairs: float  # sum over sequences of new_tokens x (already computed + new_tokens / 2)
    num_sampled: int = -1  # sequences that sample a token (run the LM head); -1: all of them


class CostModel:
    def __init__(self, deployment: Deployment, params: CostParams | None = None) -> None:
        self.params = params or deployment.cost_params or CostParams()
        p, m, g, tp = self.params, deployment.model, deployment.gpu, deployment.tp
        self._flops_per_s = tp * g.peak_flops * g.matmul_efficiency
        self._bytes_per_s = g.mem_bandwidth_bytes_s * g.bandwidth_efficiency
        self._body_flops_per_token = 2 * m.layer_params
        self._head_flops_per_sample = 2 * m.head_params
        self._attn_flops_per_pair = 4 * m.layers * m.hidden
        self._layer_weight_bytes = m.layer_params * m.dtype_bytes / tp
        self._weight_bytes = (m.layer_params + m.head_params) * m.dtype_bytes / tp
        self._kv_bytes_per_token = m.kv_bytes_per_token(tp)
        self._fixed_s = p.step_overhead_s + m.layers * p.layer_overhead_s
        self._allreduces = 2 * m.layers if tp > 1 else 0
        self._allreduce_latency_s = g.link_latency_s
        # Ring all-reduce of one token's activations: each GPU sends and receives 2 (tp-1)/tp of them.
        self._allreduce_s_per_token = (m.hidden * m.dtype_bytes * 2 * (tp - 1) / tp / g.link_bandwidth_bytes_s
                                       if tp > 1 else 0.0)

    def step_time(self, shape: StepShape) -> float:
        sampled = shape.num_seqs if shape.num_sampled < 0 else shape.num_sampled
        linear_flops = self._body_flops_per_token * shape.num_tokens + self._head_flops_per_sample * sampled
        linear = max(linear_flops / self._flops_per_s, self._weight_bytes / self._bytes_per_s)
        attention = (self._attn_flops_per_pair * shape.attention_pairs / self._flops_per_s
                     + self._kv_bytes_per_token * shape.context_tokens / self._bytes_per_s)
        allreduce = self._allreduces * (self._allreduce_latency_s + self._allreduce_s_per_token * shape.num_tokens)
        return self._fixed_s + self.params.per_seq_overhead_s * shape.num_seqs + linear + attention + allreduce

    def layers_linear_time(self, tokens: int) -> float:
        """The transformer layers' linear operators alone (no LM head, attention or overheads): what Vidur's
        kernel profile times, so the preset's efficiencies can be checked against it."""
        return max(self._body_flops_per_token * tokens / self._flops_per_s, self._layer_weight_bytes / self._bytes_per_s)

    def decode_step_time(self, batch: int, context_per_seq: int) -> float:
        """A pure decode step: `batch` sequences, one token each, with `context_per_seq` tokens of context."""
        return self.step_time(StepShape(batch, batch, batch * (context_per_seq + 1), batch * (context_per_seq + 0.5)))

    def prefill_step_time(self, prompt_tokens: int) -> float:
        """One sequence's whole prompt in one step (it samples its first token)."""
        return self.step_time(StepShape(prompt_tokens, 1, prompt_tokens, prompt_tokens * prompt_tokens / 2, 1))
