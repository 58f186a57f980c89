"""The engine core and the two loops that drive it: real time (asyncio, for the HTTP server) and virtual time.

The core does all the work in two calls: `begin_step()` schedules a batch at the clock's current time and
says how long it will take; `finish_step()` applies it at the clock's (later) time. The real-time loop sleeps
in between; the virtual loop just moves a `VirtualClock` forward. Everything else (scheduling, the KV cache,
faults, metrics) is shared, so virtual runs and served runs behave the same.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import random
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from simulator.clock import Clock, VirtualClock
from simulator.config import EngineConfig
from simulator.costmodel import CostModel, CostParams
from simulator.faults import FaultState
from simulator.kvcache import KVCacheManager
from simulator.request import FINISH_ABORT, FINISH_ERROR, Request, Status
from simulator.scheduler import ScheduledStep, Scheduler, StepOutcome

log = logging.getLogger(__name__)


class RequestError(ValueError):
    """A request the engine refuses (HTTP 400/404): the message says which field and why."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass(slots=True)
class StepStats:
    now: float
    duration: float
    num_tokens: int
    token_reqs: list[Request]  # requests that received one token this step
    num_preempted: int
    prefix_queries: int
    prefix_hits: int


class EngineObserver(Protocol):
    def on_step(self, core: "EngineCore", stats: StepStats) -> None: ...

    def on_finished(self, req: Request) -> None: ...


@dataclass(slots=True)
class PlannedStep:
    scheduled: ScheduledStep
    start: float
    duration: float


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        clock: Clock,
        cost_params: CostParams | None = None,
        faults: FaultState | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.cost = CostModel(config.deployment, cost_params)
        self.faults = faults or FaultState()
        if (config.num_gpu_blocks - 1) * config.block_size < config.model_len:  # less vLLM's null block
            raise ValueError(
                f"engine config: the KV cache holds {(config.num_gpu_blocks - 1) * config.block_size} tokens (one of "
                f"its {config.num_gpu_blocks} blocks is vLLM's null block), less than "
                f"max_model_len={config.model_len}; lower --max-model-len or give the cache more blocks"
            )
        self.kv = KVCacheManager(config.num_gpu_blocks, config.block_size, config.enable_prefix_caching,
                                 null_block=True)
        self.scheduler = Scheduler(config, self.kv)
        self.observers: list[EngineObserver] = []
        self.rng = random.Random(config.seed)
        self._ids = itertools.count()
        self._pending: list[tuple[float, int, Request]] = []  # (time it reaches the scheduler, seq, request)
        self._live: dict[str, Request] = {}
        self._abort_after: dict[str, int] = {}  # request id -> output tokens before an injected abort
        self._kv_factor_applied = 1.0
        # V0 async output processing: the last step's outcome, handed over when the next step ends
        self._held: tuple[list[Request], StepOutcome] | None = None  # (first tokens in it, the outcome)

    # ------------------------------------------------------------------ requests
    def new_request(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int | None,
        *,
        ignore_eos: bool = False,
        lora: str | None = None,
        request_id: str | None = None,
        output_len: int | None = None,
    ) -> Request:
        """Validate and build a request arriving now. `output_len` forces where it stops by itself (the
        workload generator's choice); otherwise `ignore_eos` runs to `max_tokens` and else the length is drawn."""
        model_len = self.config.model_len
        n_prompt = len(prompt_token_ids)
        if n_prompt == 0:
            raise RequestError("the prompt is empty", param="prompt")
        if lora is not None and lora not in self.config.lora_adapters:
            raise RequestError(f"The model `{lora}` does not exist.", status=404, param="model")
        if max_tokens is None:
            max_tokens = model_len - n_prompt
        if max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
        if n_prompt + max_tokens > model_len:
            raise RequestError(
                f"This model's maximum context length is {model_len} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
                param="max_tokens",
            )
        seq = next(self._ids)
        if output_len is None:
            output_len = max_tokens if ignore_eos else self._draw_output_len()
        return Request(
            request_id=request_id or f"req-{seq}",
            prompt_token_ids=prompt_token_ids,
            max_tokens=max_tokens,
            output_len=output_len,
            arrival_time=self.clock.now(),
            lora=lora,
            seed=self.config.seed * 1_000_003 + seq,
        )

    def _draw_output_len(self) -> int:
        c = self.config
        return max(1, int(round(self.rng.lognormvariate(math.log(c.output_len_median), c.output_len_sigma))))

    def add_request(self, req: Request) -> None:
        """Hand a request to the engine; it reaches the scheduler after the frontend latency. An injected
        error decides its fate here: http500 finishes it at once with reason `error`, abort cuts it off
        after a random number of its tokens."""
        self._live[req.request_id] = req
        failure = self.faults.draw_error(self.rng)
        if failure == "http500":
            req.status = Status.WAITING
            self._finish(req, FINISH_ERROR)
            return
        if failure == "abort":
            end = min(req.output_len, req.max_tokens)
            self._abort_after[req.request_id] = self.rng.randint(1, max(1, end - 1))
        ready = req.arrival_time + self.cost.params.frontend_latency_s
        heapq.heappush(self._pending, (ready, next(self._ids), req))

    def abort(self, request_id: str) -> None:
        """The client went away (or a fault cut it off): free whatever the request holds."""
        req = self._live.get(request_id)
        if req is None or req.finished:
            return
        if req.status is not Status.PENDING:  # pending ones are skipped lazily when released
            self.scheduler.remove(req)
        self._finish(req, FINISH_ABORT)

    def _finish(self, req: Request, reason: str) -> None:
        if not req.finished:
            req.status = Status.FINISHED
            req.finish_reason = reason
            req.finished_time = self.clock.now()
        self._live.pop(req.request_id, None)
        self._abort_after.pop(req.request_id, None)
        for obs in self.observers:
            obs.on_finished(req)
        if req.listener is not None:
            req.listener(req)

    # ------------------------------------------------------------------ stepping
    def has_work(self) -> bool:
        return bool(self._pending) or self.scheduler.has_work() or self._held is not None

    def next_wakeup(self) -> float | None:
        """When an idle engine must look again without being told: a pending request becomes ready or a
        timed stall ends."""
        times = []
        if self._pending:
            times.append(self._pending[0][0])
        stall = self.faults.stall_until
        if stall is not None and not math.isinf(stall) and stall > self.clock.now():
            times.append(stall)
        return min(times) if times else None

    def _release_pending(self, now: float) -> None:
        while self._pending and self._pending[0][0] <= now:
            ready, _, req = heapq.heappop(self._pending)
            if req.finished:
                continue
            req.queued_time = ready
            self.scheduler.add(req)

    def begin_step(self) -> PlannedStep | None:
        """Schedule the next batch now; None when there is nothing to run (idle, stalled, or blocked)."""
        now = self.clock.now()
        if self.faults.kv_capacity_factor != self._kv_factor_applied:
            self.kv.set_capacity_factor(self.faults.kv_capacity_factor)
            self._kv_factor_applied = self.faults.kv_capacity_factor
        self._release_pending(now)
        if self.faults.stalled(now):
            self._deliver_held(now)
            return None
        scheduled = self.scheduler.schedule(now)
        if not scheduled.entries:
            self._deliver_held(now)  # nothing runs next: V0 drains its output processor at once
            return None
        duration = self.cost.step_time(scheduled.shape) * self.faults.slowdown
        return PlannedStep(scheduled, now, duration)

    def finish_step(self, planned: PlannedStep) -> StepStats:
        now = self.clock.now()
        s = planned.scheduled
        out = self.scheduler.update(s, now)
        stats = StepStats(
            now, now - planned.start, s.shape.num_tokens, out.token_reqs, s.num_preempted, s.prefix_queries,
            s.prefix_hits,
        )
        if self.config.async_output_proc:
            # V0: this step's outputs are processed while the next step runs; the last step's reach clients now
            self._deliver_held(now)
            self._held = ([r for r in out.token_reqs if r.num_output_tokens == 1], out)
            out = StepOutcome()
        for obs in self.observers:
            obs.on_step(self, stats)
        self._deliver(out)
        return stats

    def _deliver_held(self, now: float) -> None:
        """Hand the held step's tokens and finishes to clients at `now`: first-token and finish times move there
        (the engine-side metrics already saw the step when it ended)."""
        if self._held is None:
            return
        firsts, out = self._held
        self._held = None
        for req in firsts:
            req.first_token_time = now
        for req in out.finished:
            req.last_token_time = req.finished_time = now
        self._deliver(out)

    def _deliver(self, out: StepOutcome) -> None:
        for req in out.finished:
            self._finish(req, req.finish_reason)
        for req in out.token_reqs:
            if req.finished:
                continue  # its listener already heard of the finish
            if req.listener is not None:
                req.listener(req)
            cut = self._abort_after.get(req.request_id)
            if cut is not None and req.num_output_tokens >= cut:
                self.abort(req.request_id)


class RealtimeLoop:
    """Drives a core on the wall clock inside an asyncio event loop (the HTTP server's)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def alive(self) -> bool:
        """False once the loop has died of an error (the server's /health then fails, as vLLM's does)."""
        return self._task is not None and not self._task.done()

    def notify(self) -> None:
        """Something changed (a request arrived, a fault was cleared): look again now."""
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")
        self._task.add_done_callback(_log_death)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        core = self.core
        while True:
            planned = core.begin_step()
            if planned is None:
                self._wake.clear()
                wake_at = core.next_wakeup()
                timeout = None if wake_at is None else max(0.0, wake_at - core.clock.now())
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                except TimeoutError:
                    pass
                continue
            await asyncio.sleep(planned.duration)
            core.finish_step(planned)


def _log_death(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("engine loop died", exc_info=task.exception())


def run_virtual(core: EngineCore, clock: VirtualClock, arrivals: Iterable[tuple[float, Request]]) -> None:
    """Run arrivals (time-ordered `(arrival time, request)`) to completion in simulated time, never sleeping.
    Stops early only if the engine can make no progress and nothing else will arrive (e.g. a stall
    `until cleared`, or a KV capacity too small for the next request)."""
    it = iter(arrivals)
    nxt = next(it, None)
    while True:
        while nxt is not None and nxt[0] <= clock.now():
            nxt[1].arrival_time = nxt[0]
            core.add_request(nxt[1])
            nxt = next(it, None)
        planned = core.begin_step()
        if planned is None:
            times = [t for t in (core.next_wakeup(), nxt[0] if nxt else None) if t is not None]
            if not times:
                return
            clock.set(max(clock.now(), min(times)))
            continue
        clock.advance(planned.duration)
        core.finish_step(planned)
