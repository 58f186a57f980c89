"""Iteration-level scheduling as in vLLM V1, plus a static-batching mode to compare against.

Continuous: every step first gives each running request its next tokens (the rest of its prompt, chunked to
the token budget, or one decode token), allocating KV blocks as it goes; when a block is missing it preempts
the most recently admitted request (recomputation: its blocks are freed and it rejoins the head of the
queue). If nothing was preempted, waiting requests are admitted in arrival order while the token budget,
`max_num_seqs` and free blocks allow; a request whose LoRA adapter would need a slot when all `max_loras`
are taken is skipped this step (deferred) and keeps its place.

V0 (to replay benchmarks of vLLM's V0 releases): with chunked prefill off, waiting requests are admitted
first, whole prompts within the token budget, and a step that admits any runs prompts only: the running
requests get no token that step. With `num_scheduler_steps` N > 1 (V0's multi-step), requests are admitted
only at the start of a block of N steps, so an arrival waits for the running block to end.

Static: a batch is formed only when the previous one has fully drained. Each member reserves blocks for its
whole sequence up front, so nothing is preempted, and a member that finishes early keeps its slot (padding:
it still costs a decode token per step and holds its KV) until the longest member is done.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from simulator.config import EngineConfig
from simulator.costmodel import StepShape
from simulator.kvcache import KVCacheManager
from simulator.request import FINISH_LENGTH, FINISH_STOP, Request, Status


@dataclass(slots=True)
class ScheduledStep:
    entries: list[tuple[Request, int]]  # request, tokens it runs this step
    shape: StepShape
    num_preempted: int = 0
    prefix_queries: int = 0  # tokens looked up in the prefix cache by requests admitted this step
    prefix_hits: int = 0


@dataclass(slots=True)
class StepOutcome:
    token_reqs: list[Request] = field(default_factory=list)  # got one new token this step
    finished: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.kv = kv
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_loras = config.max_loras
        self.static = config.batching == "static"
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.held: list[Request] = []  # static batching: finished members still padding the batch
        self.num_preemptions = 0
        self.chunked = config.chunked_prefill
        self.block_steps = config.num_scheduler_steps
        self._block_pos = 0  # steps into the current multi-step block; admissions only at 0

    # ------------------------------------------------------------------ queue
    def add(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    @property
    def num_deferred(self) -> int:
        return sum(1 for r in self.waiting if r.deferred)

    def running_loras(self) -> set[str]:
        return {r.lora for r in self.running if r.lora}

    def waiting_loras(self) -> set[str]:
        return {r.lora for r in self.waiting if r.lora}

    def remove(self, req: Request) -> None:
        """Take an unfinished request out (abort): free its blocks wherever it is."""
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self._release(req)
        elif req.status is Status.WAITING:
            self.waiting.remove(req)
            self.kv.free(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ schedule
    def schedule(self, now: float) -> ScheduledStep:
        step = ScheduledStep([], StepShape(0, 0, 0, 0.0))
        budget = self.max_num_batched_tokens
        if self.static and not self.running and not self.held:
            self._form_static_batch(now, step)
        admit = not self.static and (self._block_pos == 0 or not self.running)
        self._block_pos = (self._block_pos + 1) % self.block_steps if self.running or self.waiting else 0
        if admit and not self.chunked and self.waiting:
            self._admit_waiting(now, step, budget)
            if step.entries:  # V0: a prompt step; the running requests wait for the next one
                self._block_pos = 0
                step.shape = self._shape(step.entries)
                return step
        preempted = self._schedule_running(step, budget - sum(n for _, n in step.entries))
        if admit and self.chunked and not preempted:
            self._admit_waiting(now, step, budget - sum(n for _, n in step.entries))
        step.shape = self._shape(step.entries)
        return step

    def _schedule_running(self, step: ScheduledStep, budget: int) -> bool:
        preempted = False
        allocate = self.kv.allocate_slots
        running = Status.RUNNING
        for req in self.running[:]:
            if budget <= 0:
                break
            if req.status is not running:  # preempted earlier in this loop
                continue
            n = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
            if n > budget:
                n = budget
            if n <= 0:
                continue
            scheduled = True
            while not allocate(req, n):
                victim = self.running.pop()  # the most recently admitted
                self._preempt(victim)
                step.num_preempted += 1
                preempted = True
                if victim is req:
                    scheduled = False
                    break
            if scheduled:
                step.entries.append((req, n))
                budget -= n
        return preempted

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = Status.WAITING
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def _next_waiting(self, loras: set[str], skipped: list[Request]) -> Request | None:
        """The first waiting request whose LoRA adapter fits beside `loras` (left at the head of the queue); the
        ones before it that do not fit move to `skipped`, deferred. None when no waiting request fits."""
        while self.waiting:
            req = self.waiting[0]
            if not (req.lora and req.lora not in loras and len(loras) >= self.max_loras):
                return req
            skipped.append(self.waiting.popleft())
            req.deferred = True
        return None

    def _admit(self, req: Request, now: float, computed: list[int], step: ScheduledStep, loras: set[str]) -> None:
        """Move `req` from the head of the queue to running, its prefix-cache hits counted; its adapter joins `loras`."""
        self.waiting.popleft()
        if req.lora:
            loras.add(req.lora)
        hit_tokens = len(computed) * self.kv.block_size
        step.prefix_queries += req.num_tokens if self.kv.enable_prefix_caching else 0
        step.prefix_hits += hit_tokens
        req.num_computed_tokens = hit_tokens
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = hit_tokens
            req.scheduled_time = now
        req.deferred = False
        req.status = Status.RUNNING
        self.running.append(req)

    def _admit_waiting(self, now: float, step: ScheduledStep, budget: int) -> None:
        loras = self.running_loras()
        skipped: list[Request] = []
        while budget > 0 and len(self.running) < self.max_num_seqs:
            req = self._next_waiting(loras, skipped)
            if req is None:
                break
            computed = self.kv.get_computed_blocks(req)
            n = req.num_tokens - len(computed) * self.kv.block_size
            if n > budget:
                if not self.chunked and step.entries:
                    break  # V0: whole prompts only; this one waits for the next prompt step
                n = budget if self.chunked else n  # a prompt longer than the budget still runs, alone
            # V1 admits a request only if its whole sequence fits now, not just this chunk (vLLM's
            # scheduler_reserve_full_isl); V0 runs whole prompts anyway
            if not self.kv.allocate_slots(req, n, computed, must_fit_tokens=req.num_tokens if self.chunked else 0):
                break
            self._admit(req, now, computed, step, loras)
            step.entries.append((req, n))
            budget -= n
        self.waiting.extendleft(reversed(skipped))

    def _form_static_batch(self, now: float, step: ScheduledStep) -> None:
        loras: set[str] = set()
        skipped: list[Request] = []
        while len(self.running) < self.max_num_seqs:
            req = self._next_waiting(loras, skipped)
            if req is None:
                break
            computed = self.kv.get_computed_blocks(req)
            whole = req.num_prompt_tokens + req.max_tokens  # the output length is unknown in advance
            if not self.kv.allocate_slots(req, 0, computed, reserve_tokens=whole):
                break
            self._admit(req, now, computed, step, loras)
        self.waiting.extendleft(reversed(skipped))

    def _shape(self, entries: list[tuple[Request, int]]) -> StepShape:
        tokens = context = sampled = 0
        pairs = 0.0
        for req, n in entries:
            c = req.num_computed_tokens
            tokens += n
            context += c + n
            pairs += n * (c + n / 2)
            if c + n >= req.num_prompt_tokens + req.num_output_tokens:  # caught up: it samples a token
                sampled += 1
        for req in self.held:  # static batching's padding still runs through the model
            tokens += 1
            context += req.num_tokens
            pairs += req.num_tokens
        return StepShape(tokens, len(entries) + len(self.held), context, pairs, sampled + len(self.held))

    # ------------------------------------------------------------------ update
    def update(self, step: ScheduledStep, now: float) -> StepOutcome:
        """Apply a finished step: advance computed tokens, sample a token where a sequence caught up, retire
        the sequences that reached their end."""
        out = StepOutcome()
        got_token = out.token_reqs.append
        running = Status.RUNNING
        for req, n in step.entries:
            if req.status is not running:  # aborted while the step ran
                continue
            computed = req.num_computed_tokens + n
            req.num_computed_tokens = computed
            produced = req.num_output_tokens
            if computed < req.num_prompt_tokens + produced:
                continue  # a prefill chunk; no token yet
            produced += 1
            req.num_output_tokens = produced
            if produced == 1:
                req.first_token_time = req.prev_token_time = now
            else:
                req.prev_token_time = req.last_token_time
            req.last_token_time = now
            got_token(req)
            if produced >= req.output_len or produced >= req.max_tokens:
                req.finish_reason = FINISH_STOP if req.output_len < req.max_tokens else FINISH_LENGTH
                req.status = Status.FINISHED
                req.finished_time = now
                out.finished.append(req)
        if out.finished:
            self.running = [r for r in self.running if r.status is Status.RUNNING]
            for req in out.finished:
                self._release(req)
        if self.static and not self.running and self.held:
            for req in self.held:
                self.kv.free(req)
            self.held = []
        return out

    def _release(self, req: Request) -> None:
        if self.static:
            self.held.append(req)  # keeps its KV and its seat until the batch drains
        else:
            self.kv.free(req)
