"""Admission (opt-in, `--admission`): refuse a new completion with 429 when the engine would not serve it
within its class's objectives.

The gate is three parts on one clock, put together here as the one object the tap uses (`Admission`):
exporter.tap.gate_state, sans-IO (what the readings taught it, and the decision for a request);
exporter.tap.gate_poller, its I/O (the engine's /metrics every `poll_s`, read in a child process through the
exporter's own adapters, exporter.tap.gate_reading); and its gauges, rendered here through the tap's one
exposition writer (exporter.tap.exposition.render_families).

The decision is by objective (exporter.tap.predict, a pure function of what the state keeps): a request is
refused only when the engine would not start it within its class's TTFT objective, when the running requests
miss the TPOT objective because of the load, or when its class is sheddable and past the shed margin. For it
the gate also keeps the requests it admitted that the engine's page does not show yet (exporter.tap.reservations:
each takes one start seat, a median prompt of free KV, and those beyond the p99 seats wait for a finish; a reading
mid-burst used to forget them), the engine's queue as persisted over two readings and whether it keeps growing,
and the rates learned from the page's counter deltas (finishes, TTFT less queue time, ITL, service time, the batch
sizes served within each ITL). The old fixed floors, `min_seats` and `max_queue`, are operator overrides, off
unless given (the default max_queue of 4 capped an idle engine at 5 requests a poll: in front of a real vLLM it
refused 19 of a burst of 24 short requests the engine served at once).

With `taps` > 1 (`--workers N`: each worker a gate of its own) a gate counts what it admitted that the engine
does not show yet, and its in-flight requests, `taps` times: the others are taken to have done as much.

The gate only decides for a new timed request (chat/completions, completions) when it arrives;
a request already admitted is never touched. When the engine's /metrics cannot be read (refused,
timed out, not an engine's page, or the last good reading older than STALE_POLLS intervals), the gate
fails open: it admits, logs `event=tap_admission_engine_unreadable` once and shows
llm_tap_admission_engine_readable 0. A gate that refused on a blind tap would turn a broken
metrics endpoint into an outage; admitting leaves the engine's own limits (and the SLOs that
watch them) in charge, as without admission.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable, Iterable

from exporter.logs import TAP_LOGGER, event
from exporter.tap.classes import SloConfig
from exporter.tap.exposition import Samples, render_families
from exporter.tap.gate_poller import GatePoller
from exporter.tap.gate_reading import AUTO, Reading
from exporter.tap.gate_state import (
    DEFAULT_FALLBACK_FOOTPRINT,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MIN_SEATS,
    DEFAULT_POLL_S,
    DEFAULT_WINDOW_S,
    FETCH_TIMEOUT_S,
    GateRequest,
    GateSettings,
    GateState,
    Learned,
    Verdict,
)
from exporter.tap.objectives import Objective
from exporter.tap.predict import DEFAULT_SHED_MARGIN, Outlook, predicted_wait
from exporter.tap.seats import InFlight, SizeWindow
from exporter.tap.turns import ClientKeys
from llmslo import conventions as C


def poll_seconds(value: str) -> float:
    """`--admission-poll-interval`: at least 0.05 s and at most 60 s."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or not 0.05 <= seconds <= 60:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds between 0.05 and 60")
    return seconds


def non_negative_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of at least 0")
    return x


def non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 0")
    return n


def shed_margin(value: str) -> float:
    """`--admission-shed-margin`: a share of the objectives, more than 0 and at most 1."""
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a share of the objectives above 0 and at most 1")
    return x


def warn_unguarded(slo: SloConfig) -> bool:
    """Log a WARNING at start when no class gives the gate a TTFT (or TPOT) objective to decide by: without one
    it refuses nothing for the wait, and a prefill-bound overload is admitted whole (issue 34: 11 req/s on an
    engine good for 5, nothing refused, good requests down to 0 within 10 s). True when it warned."""
    ttft, tpot = slo.tightest
    missing = [name for name, objective in (("ttft", ttft), ("tpot", tpot)) if objective is None]
    if not missing:
        return False
    guards = {"ttft": "the wait to start (queue, KV, prefill-bound overload)", "tpot": "decode overload"}
    event("tap_admission_unguarded", logging.WARNING, logger=TAP_LOGGER, missing_objectives=",".join(missing),
          protects="nothing by wait" if ttft is None else "the wait to start",
          does_not_protect="; ".join(guards[m] for m in missing),
          fix="give --slo files whose goodput classes set the ttft (and tpot) objectives the gate admits by")
    return True


class Admission:
    """The gate as the tap uses it (see the module's docstring): `decide_ticket` for each new timed request, `settle`
    when it ends, `sizes.add` for each exact size, `in_flight` set to the tap's requests, `start`/`stop` around the
    server, `render` for the metrics page."""

    def __init__(
        self, upstream: str, ca_file: str = "", *, min_seats: float | None = DEFAULT_MIN_SEATS,
        max_queue: int | None = DEFAULT_MAX_QUEUE, poll_s: float = DEFAULT_POLL_S, window_s: float = DEFAULT_WINDOW_S,
        fallback_footprint: int = DEFAULT_FALLBACK_FOOTPRINT, timeout_s: float = FETCH_TIMEOUT_S,
        metrics_path: str = "/metrics", clock: Callable[[], float] = time.monotonic, engine: str = AUTO,
        sheddable: frozenset[str] = frozenset(), shed_margin: float = DEFAULT_SHED_MARGIN, slo: SloConfig | None = None,
        taps: int = 1, client_header: str = "",
    ) -> None:
        self.clock = clock
        self.settings = GateSettings(min_seats, max_queue, poll_s, window_s, float(fallback_footprint), timeout_s,
                                     sheddable, shed_margin, max(1, taps))
        self.state = GateState(self.settings, slo)
        self.clients = ClientKeys(client_header)  # how a request's client is known to the turns (exporter.tap.turns)
        # the tap's requests in flight, for the seat estimate (exporter.tap.seats); the server sets it
        self.in_flight: Callable[[], Iterable[InFlight]] = tuple
        self.poller = GatePoller(self.state, upstream.rstrip("/") + metrics_path, ca_file, engine, clock,
                                 lambda: self.in_flight())

    @property
    def sizes(self) -> SizeWindow:
        """The exact sizes of the requests that finished through this tap (exporter.tap.seats)."""
        return self.state.sizes

    @property
    def learned(self) -> Learned:
        return self.state.learned

    @property
    def readable(self) -> bool:
        """A recent reading exists (else the gate fails open)."""
        return self.state.readable(self.clock())

    def outlook(self, held: int = 0) -> Outlook:
        return self.state.outlook(self.clock(), held)

    def refusal(self, objective: Objective | None = None, slo: SloConfig | None = None, held: int = 0) -> str:
        return self.state.refusal(self.clock(), objective, slo, held)

    def is_open(self) -> bool:
        """Would a request of the tightest class arriving now be admitted (without counting it)?"""
        return self.state.is_open(self.clock())

    def decide_ticket(self, objective: Objective | None = None, slo: SloConfig | None = None,
                      client: str = "") -> Verdict:
        """Decide for one new request now (GateState.decide)."""
        return self.state.decide(GateRequest(objective, slo, client), self.clock())

    def decide(self, objective: Objective | None = None, slo: SloConfig | None = None) -> str:
        """`decide_ticket` without a client: "" (admitted, and counted until the engine shows it) or why refused."""
        return self.decide_ticket(objective, slo).refusal

    def admit(self, objective: Objective | None = None) -> bool:
        return not self.decide(objective)

    def settle(self, ticket: int) -> None:
        self.state.settle(ticket)

    def update(self, reading: Reading, asked_at: float | None = None) -> str:
        """Take a reading now, with the tap's requests in flight (GateState.update): "" or why it is not believed."""
        return self.state.update(reading, self.clock(), asked_at=asked_at, flights=list(self.in_flight()))

    async def poll(self) -> bool:
        return await self.poller.poll()

    def start(self) -> None:
        self.poller.start()

    async def stop(self) -> None:
        await self.poller.stop()

    def gauges(self) -> list[tuple[C.MetricDef, Samples]]:
        """The gate's gauges now (NaN where there is no recent reading) and its read errors by reason."""
        now, state = self.clock(), self.state
        k, readable = state.learned, state.readable(now)
        nan = math.nan
        values: tuple[tuple[C.MetricDef, int | float], ...] = (
            (C.TAP_ADMISSION_OPEN, 1 if state.is_open(now) else 0),
            (C.TAP_ADMISSION_ENGINE_READABLE, 1 if readable else 0),
            (C.TAP_ADMISSION_SEATS, k.seats if readable and math.isfinite(k.seats) else nan),
            (C.TAP_ADMISSION_FOOTPRINT, k.seat_tokens),
            (C.TAP_ADMISSION_QUEUE, k.waiting if readable else nan),
            (C.TAP_ADMISSION_PREDICTED_WAIT, predicted_wait(state.outlook(now)) if readable else nan),
            (C.TAP_ADMISSION_ENGINE_ITL, k.rates.itl_s if readable and k.rates.itl_s is not None else nan),
        )
        families: list[tuple[C.MetricDef, Samples]] = [(d, [((), v)]) for d, v in values]
        errors: Samples = [(((C.LABEL_REASON, reason),), n) for reason, n in state.health.read_errors.items()]
        return [*families, (C.TAP_ADMISSION_READ_ERRORS, errors)]

    def render(self) -> bytes:
        """The gate's gauges for the tap's /metrics page."""
        return render_families(self.gauges())
