"""A fair queue for credential checks: a flood from any number of addresses cannot lock a client out.

bcrypt costs about 60 ms of a core a check, so checks wait in a queue, and whoever fills the queue
decides who is checked. Here no one can fill it for everyone else:

- **Round-robin by source address.** Each source (the TCP peer) has its own queue of at most
  MAX_PER_SOURCE checks; the worker takes one check from each waiting source in turn. A client
  waits behind at most one check per other source, however many requests each of them sent: a flood
  from N addresses gets at most N of every N+1 checks.
- **At most MAX_SOURCES sources wait at once.** A new source, when all places are taken, takes the
  place of the waiting source that asked for the most checks lately (a count halved every
  DEMAND_HALF_LIFE_S, kept for the REMEMBERED_SOURCES most recent sources), whose queued checks are
  answered 429; it is refused instead when no waiting source asked for more than it did. A flooding
  address asks for checks many times a second; a Prometheus asks once per credential, so it is
  never the one pushed out, and it pushes a flooder out to get in.
- **Sources that proved themselves go first.** A (source, user) whose last check succeeded is
  remembered (REMEMBERED_SOURCES pairs at most); its next check (after a web-config reload emptied
  the caches) is taken before the round-robin ones. A failed check forgets the pair.

Everything is touched on the event loop only; the checks themselves run in WORKERS threads of their
own (never the default pool, which parses pages). A client that goes away while its check waits
takes the check with it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

WORKERS = 1  # as exporter-toolkit (a mutex around bcrypt): a flood holds one core at most
MAX_PER_SOURCE = 4
MAX_SOURCES = 16  # a client waits behind at most this many checks: about 1 s of one idle core
REMEMBERED_SOURCES = 4096
DEMAND_HALF_LIFE_S = 60.0


class Refused(Exception):
    """No place for this check (or its place went to a source that asked for fewer): answer 429."""


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    source: str
    trust_key: tuple[str, str]
    future: asyncio.Future = field(repr=False)
    started: bool = False


class Demand:
    """How many checks each source asked for lately: a count halved every `half_life_s`, for the
    `limit` most recently seen sources (the others count as none)."""

    def __init__(self, half_life_s: float = DEMAND_HALF_LIFE_S, limit: int = REMEMBERED_SOURCES,
                 clock: Callable[[], float] = time.monotonic):
        self.half_life_s, self.limit, self.clock = half_life_s, limit, clock
        self._seen: OrderedDict[str, tuple[float, float]] = OrderedDict()  # source -> (count, as of)

    def of(self, source: str) -> float:
        count, at = self._seen.get(source, (0.0, 0.0))
        return count * 0.5 ** ((self.clock() - at) / self.half_life_s) if count else 0.0

    def add(self, source: str) -> float:
        """Count one more check asked for by `source`; its demand, this one included."""
        demand = self.of(source) + 1.0
        self._seen[source] = (demand, self.clock())
        self._seen.move_to_end(source)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)
        return demand


class FairCheckQueue:
    """Runs blocking checks (`fn(*args)` returning True when the credentials are good) in `workers`
    threads, admitting and ordering them fairly across source addresses (see the module docstring)."""

    def __init__(self, workers: int = WORKERS, max_sources: int = MAX_SOURCES, max_per_source: int = MAX_PER_SOURCE,
                 demand: Demand | None = None):
        self.workers, self.max_sources, self.max_per_source = workers, max_sources, max_per_source
        self.demand = demand or Demand()
        self._waiting: OrderedDict[str, deque[_Job]] = OrderedDict()  # round-robin order: the first goes next
        self._trusted: deque[_Job] = deque()
        self._trust: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._per_source: dict[str, int] = {}  # queued or running, by source (entries at 0 removed)
        self._running = 0
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llmslo-bcrypt")

    @property
    def pending(self) -> int:
        """Checks queued or running."""
        return sum(self._per_source.values())

    @property
    def waiting_sources(self) -> int:
        return len(self._waiting)

    async def run(self, fn: Callable[..., Any], *args: Any, source: str = "", user: str = "") -> Any:
        """`fn(*args)` in a check thread once its turn comes; raises Refused when it gets no place."""
        job = _Job(fn, args, source, (source, user), asyncio.get_running_loop().create_future())
        self._admit(job)
        self._per_source[source] = self._per_source.get(source, 0) + 1
        self._dispatch()
        try:
            return await job.future
        except asyncio.CancelledError:
            self._withdraw(job)  # the client went away: its check, if not started, goes too
            raise

    def _admit(self, job: _Job) -> None:
        demand = self.demand.add(job.source)
        if self._per_source.get(job.source, 0) >= self.max_per_source:
            raise Refused(f"{self.max_per_source} checks from this source already wait")
        if job.trust_key in self._trust and len(self._trusted) < self.max_sources * self.max_per_source:
            self._trusted.append(job)
            return
        if job.source not in self._waiting and len(self._waiting) >= self.max_sources:
            victim = max(self._waiting, key=self.demand.of)
            if self.demand.of(victim) <= demand:
                raise Refused(f"{self.max_sources} sources that asked for fewer checks already wait")
            self._push_out(victim)
        self._waiting.setdefault(job.source, deque()).append(job)

    def _push_out(self, source: str) -> None:
        for job in self._waiting.pop(source):
            self._forget(job)
            if not job.future.done():
                job.future.set_exception(Refused("a source that asked for fewer checks took this place"))

    def _next(self) -> _Job | None:
        if self._trusted:
            return self._trusted.popleft()
        if not self._waiting:
            return None
        source, jobs = next(iter(self._waiting.items()))
        job = jobs.popleft()
        if jobs:
            self._waiting.move_to_end(source)
        else:
            del self._waiting[source]
        return job

    def _dispatch(self) -> None:
        while self._running < self.workers:
            job = self._next()
            if job is None:
                return
            job.started = True
            self._running += 1
            running = asyncio.get_running_loop().run_in_executor(self._executor, job.fn, *job.args)
            running.add_done_callback(functools.partial(self._finished, job))

    def _finished(self, job: _Job, done: asyncio.Future) -> None:
        self._running -= 1
        self._forget(job)
        error = Refused("the check queue closed") if done.cancelled() else done.exception()
        if error is None:
            self._remember(job.trust_key, bool(done.result()))
        if job.future.done():
            pass  # the client went away meanwhile
        elif error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(done.result())
        if not self._closed:
            self._dispatch()

    def _remember(self, key: tuple[str, str], ok: bool) -> None:
        self._trust.pop(key, None)
        if ok:
            self._trust[key] = None
            while len(self._trust) > REMEMBERED_SOURCES:
                self._trust.popitem(last=False)

    def _forget(self, job: _Job) -> None:
        left = self._per_source[job.source] - 1
        if left:
            self._per_source[job.source] = left
        else:
            del self._per_source[job.source]

    def _withdraw(self, job: _Job) -> None:
        if job.started:
            return
        queue = self._waiting.get(job.source)
        if job in self._trusted:
            self._trusted.remove(job)
        elif queue is not None and job in queue:
            queue.remove(job)
            if not queue:
                del self._waiting[job.source]
        else:
            return  # already pushed out (and forgotten)
        self._forget(job)

    def close(self) -> None:
        """Refuse what still waits and stop the threads."""
        waiting = [*self._trusted, *(job for jobs in self._waiting.values() for job in jobs)]
        self._trusted.clear()
        self._waiting.clear()
        for job in waiting:
            self._forget(job)
            if not job.future.done():
                job.future.set_exception(Refused("the check queue closed"))
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
