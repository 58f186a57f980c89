"""Synthetic traffic, shared by virtual mode and the load generator so both run the same workload.

Arrivals are Poisson (open loop: they do not wait for earlier requests) over a duration, or an exact number
of requests: Poisson at a rate, or all at t=0 with rate inf (vLLM's `--request-rate inf`, and the offline
benchmarks). Prompt and output lengths are lognormal around a median, clamped; an optional filter redraws
pairs that break vLLM's benchmark limits (ShareGPT: prompt <= 1024, prompt + output <= 2048). A `shared_prefix` fraction of every prompt's tokens is the head of one of
`num_prefixes` shared system prompts, so the prefix-cache hit rate follows that fraction (less the partial
block at the end of each prefix, which cannot be cached). A LoRA mix sends a share of requests to adapters.
Everything is drawn from one seeded generator: the same spec gives the same requests. A run holds all its
requests, so their number is bounded (`MAX_REQUESTS`, however it is asked for) and a prompt's ids are not a list
(`PromptIds`): a request's memory does not grow with its prompt.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import overload

from simulator.limits import MAX_REQUESTS
from simulator.tokens import VOCAB_SIZE

# Poisson arrivals at rate x duration = MAX_REQUESTS overshoot it by a few standard deviations (1,000 at the
# cap) at most; the generator stops with an error past this, whatever the spec says.
HARD_MAX_REQUESTS = MAX_REQUESTS + MAX_REQUESTS // 100
MAX_REDRAWS = 1000  # length pairs drawn per request before the filter is declared unsatisfiable


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
    num_requests: int = 0  # > 0: exactly this many requests (duration ignored); rate may then be inf
    max_prompt_len: int = 0  # > 0: redraw pairs whose prompt is longer (vLLM's ShareGPT filter: 1024)
    max_total_len: int = 0  # > 0: redraw pairs whose prompt + output is longer (vLLM's ShareGPT filter: 2048)

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"workload: --rate must be positive (or inf with --num-requests), got {self.rate}")
        if not 0 <= self.num_requests <= MAX_REQUESTS:
            raise ValueError(f"workload: --num-requests must be from 0 to {MAX_REQUESTS}, got {self.num_requests}")
        if math.isinf(self.rate) and not self.num_requests:
            raise ValueError("workload: --rate inf sends everything at once, so it needs --num-requests")
        if not self.num_requests and not 0 < self.duration < math.inf:
            raise ValueError(f"workload: --duration must be positive, got {self.duration}")
        if not self.num_requests and self.rate * self.duration > MAX_REQUESTS:
            raise ValueError(f"workload: --rate {self.rate:g} x --duration {self.duration:g} s asks for "
                             f"{self.rate * self.duration:,.0f} requests; a run holds at most {MAX_REQUESTS:,} "
                             "(they are kept in memory): lower one of them")
        if self.max_prompt_len < 0 or self.max_total_len < 0:
            raise ValueError("workload: --max-prompt-len and --max-total-len are >= 0 (0: no limit)")
        if self.max_prompt_len and self.max_prompt_len < self.prompt_len.low:
            raise ValueError(f"workload: --max-prompt-len {self.max_prompt_len} is below the shortest prompt "
                             f"({self.prompt_len.low})")
        if self.max_total_len and self.max_total_len < self.prompt_len.low + self.output_len.low:
            raise ValueError(f"workload: --max-total-len {self.max_total_len} is below the shortest prompt + "
                             f"output ({self.prompt_len.low + self.output_len.low})")
        if not 0.0 <= self.shared_prefix <= 1.0:
            raise ValueError(f"workload: --shared-prefix is a fraction from 0 to 1, got {self.shared_prefix}")
        if self.num_prefixes < 1:
            raise ValueError("workload: num_prefixes must be at least 1")
        if sum(share for _, share in self.lora_mix) > 1.0 + 1e-9:
            raise ValueError("workload: --lora-mix shares add up to more than 1")


@dataclass(frozen=True)
class Dataset:
    """A named length distribution with its filter: what `--dataset NAME` stands for."""

    prompt_len: LengthDist
    output_len: LengthDist
    max_prompt_len: int = 0
    max_total_len: int = 0


# ShareGPT as vLLM's benchmark samples it (pairs with prompt or output < 4, prompt > 1024 or prompt + output >
# 2048 are dropped). We hold no copy of the data set: lognormal stand-ins whose filtered means come out at the
# ~202 prompt / ~179 output tokens the vLLM v0.6.0 benchmark reports for it (medians 140 and 132; sigmas 1.0 and
# 0.8 give its long tails: prompts from a few words to pasted documents, a few answers past 1000 tokens). The
# tail is a guess, and a run of a few hundred requests at once ends with its longest answer.
DATASETS: dict[str, Dataset] = {
    "sharegpt": Dataset(LengthDist(140, 1.0, 4, 2048), LengthDist(132, 0.8, 4, 2048), 1024, 2048),
}


class PromptIds(Sequence[int]):
    """A generated prompt's token ids without a list of them: the head of a shared system prompt, then a run of
    consecutive fresh ids. Equal to the list it stands for; a million queued requests of 500 tokens would
    otherwise hold 20 GB of ints."""

    __slots__ = ("_prefix", "_shared", "_start", "_len")

    def __init__(self, prefix: Sequence[int], shared: int, start: int, length: int) -> None:
        self._prefix, self._shared, self._start, self._len = prefix, shared, start, length

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        return chain(self._prefix[:self._shared], range(self._start, self._start + self._len - self._shared))

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            lo, hi, step = index.indices(self._len)
            if step != 1:
                return [self[i] for i in range(lo, hi, step)]
            head = list(self._prefix[lo:min(hi, self._shared)]) if lo < self._shared else []
            a, b = max(lo, self._shared), max(hi, self._shared)
            return head + list(range(self._start + a - self._shared, self._start + b - self._shared))
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError("prompt index out of range")
        return self._prefix[i] if i < self._shared else self._start + i - self._shared

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._len and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"PromptIds({self._shared} shared + {self._len - self._shared} from {self._start})"


@dataclass(frozen=True, slots=True)
class WorkItem:
    arrival: float  # seconds from the start
    prompt_token_ids: Sequence[int]  # a PromptIds from `generate`
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
    longest = min(spec.prompt_len.high, max_model_len)  # a prompt is never longer than the model takes
    prefixes = [array("i", (rng.randrange(VOCAB_SIZE) for _ in range(longest))) for _ in range(spec.num_prefixes)]
    items: list[WorkItem] = []
    at_once = math.isinf(spec.rate)
    t = 0.0 if at_once else rng.expovariate(spec.rate)
    while (len(items) < spec.num_requests) if spec.num_requests else (t < spec.duration):
        if len(items) >= HARD_MAX_REQUESTS:
            raise ValueError(f"workload: more than {HARD_MAX_REQUESTS:,} requests; lower --rate or --duration")
        prompt_len, output_len = _lengths(spec, rng, max_model_len)
        shared = int(round(spec.shared_prefix * prompt_len))
        prefix = prefixes[rng.randrange(spec.num_prefixes)] if shared else ()
        base = rng.randrange(1 << 40)  # a fresh run of ids: this prompt's own tokens share nothing
        items.append(WorkItem(t, PromptIds(prefix, shared, base, prompt_len), output_len, _pick_lora(spec, rng)))
        if not at_once:
            t += rng.expovariate(spec.rate)
    return items


def _lengths(spec: WorkloadSpec, rng: random.Random, max_model_len: int) -> tuple[int, int]:
    """One (prompt, output) pair: redrawn until it passes the spec's filter, then cut to the model length."""
    for _ in range(MAX_REDRAWS):
        prompt_len, output_len = spec.prompt_len.sample(rng), spec.output_len.sample(rng)
        if spec.max_prompt_len and prompt_len > spec.max_prompt_len:
            continue
        if spec.max_total_len and prompt_len + output_len > spec.max_total_len:
            continue
        break
    else:
        raise ValueError(f"workload: no prompt/output pair in {MAX_REDRAWS} draws passes --max-prompt-len "
                         f"{spec.max_prompt_len} and --max-total-len {spec.max_total_len}; lower the medians")
    output_len = min(output_len, max_model_len - 1)
    return max(1, min(prompt_len, max_model_len - output_len)), output_len


def _pick_lora(spec: WorkloadSpec, rng: random.Random) -> str | None:
    if not spec.lora_mix:
        return None
    r = rng.random()
    for name, share in spec.lora_mix:
        if r < share:
            return name
        r -= share
    return None
