"""Synthetic traffic, shared by virtual mode and the load generator so both run the same workload.

Arrivals are Poisson (open loop: they do not wait for earlier requests). Prompt and output lengths are
lognormal around a median, clamped. A `shared_prefix` fraction of every prompt's tokens is the head of one of
`num_prefixes` shared system prompts, so the prefix-cache hit rate follows that fraction (less the partial
block at the end of each prefix, which cannot be cached). A LoRA mix sends a share of requests to adapters.
Everything is drawn from one seeded generator: the same spec gives the same requests.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from simulator.tokens import VOCAB_SIZE


@dataclass(frozen=True)
class LengthDist:
    median: float
    sigma: float = 0.5
    low: int = 1
    high: int = 8192

    def sample(self, rng: random.Random) -> int:
        value = self.median if self.sigma <= 0 else rng.lognormvariate(math.log(self.median), self.sigma)
        return min(self.high, max(self.low, int(round(value))))


@dataclass(frozen=True)
class WorkloadSpec:
    rate: float  # requests per second (mean of the Poisson process)
    duration: float  # seconds of arrivals
    prompt_len: LengthDist = LengthDist(500, 0.5, 16, 4000)
    output_len: LengthDist = LengthDist(150, 0.6, 2, 1500)
    shared_prefix: float = 0.0  # fraction of each prompt taken from a shared system prompt
    num_prefixes: int = 4
    lora_mix: tuple[tuple[str, float], ...] = ()  # (adapter, share); the rest go to the base model
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"workload: --rate must be positive, got {self.rate}")
        if self.duration <= 0:
            raise ValueError(f"workload: --duration must be positive, got {self.duration}")
        if not 0.0 <= self.shared_prefix <= 1.0:
            raise ValueError(f"workload: --shared-prefix is a fraction from 0 to 1, got {self.shared_prefix}")
        if self.num_prefixes < 1:
            raise ValueError("workload: num_prefixes must be at least 1")
        if sum(share for _, share in self.lora_mix) > 1.0 + 1e-9:
            raise ValueError("workload: --lora-mix shares add up to more than 1")


@dataclass(frozen=True, slots=True)
class WorkItem:
    arrival: float  # seconds from the start
    prompt_token_ids: list[int]
    output_len: int
    lora: str | None


def parse_lora_mix(text: str) -> tuple[tuple[str, float], ...]:
    """`a=0.3,b=0.2` -> (("a", 0.3), ("b", 0.2))."""
    mix = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, share = part.partition("=")
        try:
            value = float(share)
        except ValueError:
            value = -1.0
        if not sep or not name or not 0.0 <= value <= 1.0:
            raise ValueError(f"--lora-mix: {part!r} must look like ADAPTER=SHARE with SHARE from 0 to 1, e.g. sql=0.3")
        mix.append((name.strip(), value))
    return tuple(mix)


def generate(spec: WorkloadSpec, max_model_len: int = 1 << 30) -> list[WorkItem]:
    """The spec's requests in arrival order; prompts are cut so prompt + output fits `max_model_len`."""
    rng = random.Random(spec.seed)
    longest = spec.prompt_len.high
    prefixes = [[rng.randrange(VOCAB_SIZE) for _ in range(longest)] for _ in range(spec.num_prefixes)]
    items: list[WorkItem] = []
    t = rng.expovariate(spec.rate)
    while t < spec.duration:
        output_len = min(spec.output_len.sample(rng), max_model_len - 1)
        prompt_len = max(1, min(spec.prompt_len.sample(rng), max_model_len - output_len))
        shared = int(round(spec.shared_prefix * prompt_len))
        prefix = prefixes[rng.randrange(spec.num_prefixes)][:shared] if shared else []
        base = rng.randrange(1 << 40)  # a fresh run of ids: this prompt's own tokens share nothing
        items.append(WorkItem(t, prefix + list(range(base, base + prompt_len - shared)), output_len, _pick_lora(spec, rng)))
        t += rng.expovariate(spec.rate)
    return items


def _pick_lora(spec: WorkloadSpec, rng: random.Random) -> str | None:
    if not spec.lora_mix:
        return None
    r = rng.random()
    for name, share in spec.lora_mix:
        if r < share:
            return name
        r -= share
    return None
