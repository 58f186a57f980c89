"""Capacity planning: the highest arrival rate one replica sustains while meeting a goodput objective.

`llmslo-sim plan` reads one goodput class (the `llmslo/goodput` SLI plugin's `slo_class`, `ttft`,
`tpot`, and the SLO's `objective` in %) from an SLO file, then searches, in virtual time, for the
highest Poisson arrival rate at which the share of good requests still meets the objective:

- every probe runs the same workload (same seed: the same prompts and output lengths, arrival gaps
  scaled by 1/rate) through one replica of the preset, to completion;
- a request is good exactly as the goodput tap judges it (docs/metrics.md, "Goodput tap"): it
  completed, produced output, TTFT <= the class's TTFT objective and TPOT <= its TPOT objective,
  with TPOT = (t_last_token - t_first_token) / (n_out - 1), 0 when n_out <= 1, and `<=` as a
  histogram's `le`; attainment = good / all requests of the probe;
- the search doubles the rate until a probe fails, then bisects between the last passing and the
  first failing rate until they are within `tolerance` of each other;
- one workload seed's cliff edge is luck (at one seed's highest passing rate another seed may miss), so
  `find_max_rate_all_seeds` searches each of N seeds, takes the lowest of their highest rates, checks it
  passes on every seed (searching below it with "every seed passes" as the test if not), and keeps each
  seed's own result as the spread;
- a probe's requests (rate x duration) are capped at `limits.MAX_REQUESTS`, so the search's ceiling is
  min(10,000 req/s, MAX_REQUESTS / duration).

Replicas for a target rate = ceil(target / per-replica rate), assuming the load spreads evenly and
replicas do not interact (no shared prefix cache, no cross-replica queueing). docs/capacity.md says
how far to trust the numbers.

The simulator does not import the exporter: the goodput rule is the tap's own (`llmslo.goodput`), the
SLO files are read through the shared reader `llmslo.specfile`, and tests/simulator/test_plan.py
checks that the classes read here agree with the tap's `load_slo_config`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from llmslo.goodput import streamed_good
from llmslo.ranges import ALLOW_KEY
from llmslo.sli_plugins import GOODPUT as GOODPUT_PLUGIN
from llmslo.sli_plugins import GoodputParams, PluginOptionError, read_options
from llmslo.specfile import SpecFileError, discover, read_documents
from simulator.config import EngineConfig
from simulator.faults import FaultState
from simulator.limits import MAX_PLAN_REQUESTS, MAX_REQUESTS, START_RATE
from simulator.request import FINISH_LENGTH, FINISH_STOP, Request
from simulator.virtual import simulate
from simulator.workload import WorkloadSpec


@dataclass(frozen=True)
class GoodputClass:
    """One goodput class and its objective: the share of good requests, in percent."""

    name: str
    ttft: float | None  # seconds; None: not constrained
    tpot: float | None
    objective: float  # percent, e.g. 95
    origin: str = ""


def _slo_list(doc: Any) -> list[Any]:
    if not isinstance(doc, dict):
        return []
    if "slos" in doc:
        slos = doc["slos"]
    elif doc.get("kind") == "PrometheusServiceLevel" and isinstance(doc.get("spec"), dict):
        slos = doc["spec"].get("slos")
    else:
        slos = None
    return slos if isinstance(slos, list) else []


def goodput_classes(paths: list[str | Path] | tuple[str | Path, ...]) -> list[GoodputClass]:
    """Every goodput SLO in the files (a directory: its *.yaml / *.yml), in file order."""
    found: list[GoodputClass] = []
    for path in (f for p in paths for f in discover(p)):
        try:
            docs = read_documents(path)
        except (OSError, SpecFileError) as e:
            raise ValueError(f"--slo {path}: {e}") from None
        for doc in docs:
            for slo in _slo_list(doc):
                if not isinstance(slo, dict):
                    continue
                sli = slo.get("sli")
                plugin = sli.get("plugin") if isinstance(sli, dict) else None
                if not isinstance(plugin, dict) or plugin.get("id") != GOODPUT_PLUGIN:
                    continue
                origin = f"{path}: SLO {slo.get('name', '?')!r}"
                try:  # the plugin contract's reader, as the tap and slogen read these options
                    params = read_options(GOODPUT_PLUGIN, plugin.get("options"),
                                          allow_out_of_range=slo.get(ALLOW_KEY) is True)
                except PluginOptionError as e:
                    field = "sli.plugin.options" + (f".{e.option}" if e.option else "")
                    raise ValueError(f"{origin}: {field}: {e}" + (f" (fix: {e.fix})" if e.fix else "")) from None
                assert isinstance(params, GoodputParams)
                objective = slo.get("objective")
                if isinstance(objective, bool) or not isinstance(objective, (int, float)) or not 0 < objective < 100:
                    raise ValueError(f"{origin}: objective: {objective!r} must be a percentage between 0 and 100")
                found.append(GoodputClass(params.slo_class, params.ttft, params.tpot, float(objective), origin))
    return found


def load_goodput_class(paths: list[str | Path] | tuple[str | Path, ...], name: str = "") -> GoodputClass:
    """The goodput class called `name` (empty: the only one) from SLO files."""
    classes = goodput_classes(paths)
    shown = ", ".join(str(p) for p in paths)
    if not classes:
        raise ValueError(f"--slo {shown}: no SLO uses the {GOODPUT_PLUGIN} plugin, so there is no goodput objective")
    if not name:
        names = sorted({c.name for c in classes})
        if len(names) > 1:
            raise ValueError(f"--slo {shown}: several goodput classes ({', '.join(names)}); pick one with --class")
        name = names[0]
    matching = [c for c in classes if c.name == name]
    if not matching:
        raise ValueError(f"--class {name!r}: not a goodput class of {shown}; "
                         f"choose one of: {', '.join(sorted({c.name for c in classes}))}")
    first = matching[0]
    for other in matching[1:]:
        if (other.ttft, other.tpot) != (first.ttft, first.tpot):  # the tap refuses these files too
            raise ValueError(f"{other.origin}: slo_class {name!r} is also defined by {first.origin} with other "
                             "thresholds; give each class one definition")
    return max(matching, key=lambda c: c.objective)  # several goodput SLOs for one class: the strictest


def request_timings(req: Request) -> tuple[float | None, float | None]:
    """TTFT and TPOT of a finished request, as the tap measures them (None: no output)."""
    if req.num_output_tokens < 1:
        return None, None
    ttft = req.first_token_time - req.arrival_time
    n = req.num_output_tokens
    tpot = (req.last_token_time - req.first_token_time) / (n - 1) if n > 1 else 0.0
    return ttft, tpot


RUNNING_EVERY = 2_000  # finished requests between two calls of a probe's `on_running`: a few a second


class _GoodCounter:
    """Observer counting finished requests and the good ones; tells `on_running(finished)` every RUNNING_EVERY."""

    def __init__(self, cls: GoodputClass, on_running: Callable[[int], None] | None = None) -> None:
        self.cls = cls
        self.on_running = on_running
        self.finished = 0
        self.good = 0

    def on_step(self, core: Any, stats: Any) -> None:
        pass

    def on_finished(self, req: Request) -> None:
        self.finished += 1
        if self.on_running is not None and self.finished % RUNNING_EVERY == 0:
            self.on_running(self.finished)
        if req.finish_reason in (FINISH_STOP, FINISH_LENGTH) and streamed_good(
            *request_timings(req), self.cls.ttft, self.cls.tpot
        ):
            self.good += 1


@dataclass(frozen=True)
class Probe:
    """One simulated run at one arrival rate."""

    rate: float
    requests: int
    good: int
    passed: bool
    seed: int = 0  # the workload's

    @property
    def attainment(self) -> float:
        return self.good / self.requests if self.requests else 1.0


def probe(config: EngineConfig, spec: WorkloadSpec, cls: GoodputClass, rate: float,
          faults: Callable[[], FaultState] | None = None, on_running: Callable[[int], None] | None = None) -> Probe:
    """Run `spec` at `rate` through one replica; pass when good / all >= the objective. A long probe calls
    `on_running(finished requests)` as it goes."""
    run_spec = dataclasses.replace(spec, rate=rate)
    counter = _GoodCounter(cls, on_running)
    run = simulate(config, run_spec, ttft_slo=cls.ttft or math.inf, tpot_slo=cls.tpot or math.inf,
                   faults=faults() if faults else None, observers=(counter,))
    total = counter.finished + run.summary["unfinished"]  # an unfinished request is not good
    passed = total > 0 and counter.good * 100.0 >= cls.objective * total
    return Probe(rate, total, counter.good, passed, spec.seed)


@dataclass
class PlanResult:
    preset: str
    slo_class: GoodputClass
    max_rate: float  # highest passing rate found; 0.0 when even `min_rate` fails
    first_failing_rate: float | None  # the lowest failing rate found; None when `max_rate_cap` passed
    probes: list[Probe] = field(default_factory=list)

    @property
    def best(self) -> Probe | None:
        passing = [p for p in self.probes if p.passed and p.rate == self.max_rate]
        return passing[0] if passing else None

    @property
    def failing(self) -> Probe | None:
        failing = [p for p in self.probes if not p.passed and p.rate == self.first_failing_rate]
        return failing[0] if failing else None

    def replicas(self, target_rate: float) -> int | None:
        return replicas_for(target_rate, self.max_rate)


def replicas_for(target_rate: float, per_replica_rate: float) -> int | None:
    """ceil(target / per replica): load spread evenly over independent replicas. None: no rate passes."""
    if target_rate <= 0:
        return 0
    if per_replica_rate <= 0:
        return None
    # Guard against float noise: 30.000000000000004 / 10 is still 3 replicas.
    return max(1, math.ceil(target_rate / per_replica_rate - 1e-9))


MIN_RATE, MAX_RATE_CAP = START_RATE.low, START_RATE.high  # the search's floor and ceiling, req/s per replica

OnProbe = Callable[[str, Probe], None]  # (preset, probe): told after every probe (progress)


def rate_cap(spec: WorkloadSpec, max_rate_cap: float = MAX_RATE_CAP) -> float:
    """The highest rate a probe may run: its requests (rate x duration) stay within MAX_REQUESTS."""
    return max_rate_cap if spec.num_requests else min(max_rate_cap, MAX_REQUESTS / spec.duration)


def search_rate(passes: Callable[[float], bool], start_rate: float, tolerance: float, min_rate: float,
            cap: float) -> tuple[float, float | None]:
    """(highest passing rate or 0.0, lowest failing rate or None): doubling or halving from `start_rate`, then
    bisection until the two are within `tolerance` of each other (relative)."""
    lo, hi = 0.0, None  # lo passes (0 trivially), hi fails
    rate = start_rate
    if passes(rate):
        lo = rate
        while hi is None and rate < cap:
            rate = min(rate * 2, cap)
            if passes(rate):
                lo = rate
            else:
                hi = rate
    else:
        hi = rate
        while lo == 0.0 and rate > min_rate:
            rate = max(rate / 2, min_rate)
            if passes(rate):
                lo = rate
            else:
                hi = rate
    if hi is not None and lo > 0:
        while (hi - lo) > tolerance * hi:
            mid = (lo + hi) / 2
            if passes(mid):
                lo = mid
            else:
                hi = mid
    return lo, hi


def expected_requests(spec: WorkloadSpec, rate: float) -> int:
    """A probe's requests: the workload's count, else rate x duration (the Poisson mean)."""
    return spec.num_requests or max(1, round(rate * spec.duration))


def probes_per_search(tolerance: float) -> int:
    """About the probes one seed's search runs: a step or two of doubling or halving, then bisection from a
    factor of 2 down to `tolerance`."""
    return 2 + math.ceil(math.log2(1 / tolerance))


def check_work(spec: WorkloadSpec, start_rate: float, tolerance: float, seeds: int, presets: int) -> None:
    """Refuse a plan whose probes at the start rate alone would pass MAX_PLAN_REQUESTS simulated requests (after
    the checks of one search, whose errors are more specific)."""
    _check_search(spec, start_rate, tolerance, rate_cap(spec))
    per_probe, probes = expected_requests(spec, start_rate), probes_per_search(tolerance)
    work = presets * seeds * probes * per_probe
    if work > MAX_PLAN_REQUESTS:
        raise ValueError(
            f"{presets} preset(s) x --seeds {seeds} x ~{probes} probes each (--tolerance {tolerance:g}) x {per_probe:,} "
            f"requests a probe (--start-rate {start_rate:g} x --duration {spec.duration:g} s) is ~{work:,} simulated "
            f"requests, over the {MAX_PLAN_REQUESTS:,} a plan may take (about an hour at ~3,000 a second): lower "
            "--seeds, --start-rate or --duration, raise --tolerance, or plan one --preset at a time")


OnRunning = Callable[[str, int, float, int, int], None]  # (preset, seed, rate, finished, expected) during a probe


class _Prober:
    """Runs probes once each: the per-seed searches and the all-seeds check share them. Stops the plan (ValueError)
    before a probe that would take its simulated requests past MAX_PLAN_REQUESTS."""

    def __init__(self, config: EngineConfig, cls: GoodputClass, faults: Callable[[], FaultState] | None,
                 on_probe: OnProbe | None, on_running: OnRunning | None = None) -> None:
        self.config, self.cls, self.faults, self.on_probe = config, cls, faults, on_probe
        self.on_running = on_running
        self.done: dict[tuple[int, float], Probe] = {}
        self.simulated = 0

    def _budget(self, spec: WorkloadSpec, rate: float) -> Callable[[int], None] | None:
        expected = expected_requests(spec, rate)
        if self.simulated + expected > MAX_PLAN_REQUESTS:
            raise ValueError(f"the search has simulated {self.simulated:,} requests and its next probe ({rate:g} req/s x "
                             f"--duration {spec.duration:g} s) would pass the {MAX_PLAN_REQUESTS:,} a plan may take: "
                             "shorten --duration, or lower --seeds")
        self.simulated += expected
        if self.on_running is None:
            return None
        tell, name = self.on_running, self.config.deployment.name
        return lambda finished: tell(name, spec.seed, rate, finished, expected)

    def __call__(self, spec: WorkloadSpec, rate: float) -> Probe:
        key = (spec.seed, rate)
        if key not in self.done:
            self.done[key] = probe(self.config, spec, self.cls, rate, self.faults, self._budget(spec, rate))
            if self.on_probe is not None:
                self.on_probe(self.config.deployment.name, self.done[key])
        return self.done[key]


def _check_search(spec: WorkloadSpec, start_rate: float, tolerance: float, cap: float) -> None:
    if not 0 < tolerance < 1:
        raise ValueError(f"--tolerance: {tolerance} must be between 0 and 1")
    if not START_RATE.accepts(start_rate):
        raise ValueError(f"--start-rate: {start_rate} is not {START_RATE.describe()}")
    if start_rate > cap:
        raise ValueError(f"--start-rate: {start_rate:g} req/s for --duration {spec.duration:g} s is more than "
                         f"{MAX_REQUESTS:,} requests a probe; start at {cap:g} or below, or shorten --duration")


def find_max_rate(
    config: EngineConfig,
    spec: WorkloadSpec,
    cls: GoodputClass,
    *,
    start_rate: float = 1.0,
    tolerance: float = 0.02,
    min_rate: float = MIN_RATE,
    max_rate_cap: float = MAX_RATE_CAP,
    faults: Callable[[], FaultState] | None = None,
    on_probe: OnProbe | None = None,
    _prober: _Prober | None = None,
) -> PlanResult:
    """One seed's search: coarse (doubling or halving from `start_rate`) then fine (bisection to `tolerance`)."""
    cap = rate_cap(spec, max_rate_cap)
    _check_search(spec, start_rate, tolerance, cap)
    prober = _prober or _Prober(config, cls, faults, on_probe)
    probes: list[Probe] = []

    def passes(rate: float) -> bool:
        p = prober(spec, rate)
        probes.append(p)
        return p.passed

    lo, hi = search_rate(passes, start_rate, tolerance, min_rate, cap)
    return PlanResult(config.deployment.name, cls, lo, hi, probes)


@dataclass
class SeedsResult:
    """The highest rate that meets the objective on every seed, and each seed's own answer (the spread)."""

    preset: str
    slo_class: GoodputClass
    max_rate: float  # passes on every seed; 0.0 when no rate does
    first_failing_rate: float | None  # the lowest rate found where some seed fails; None: every seed passed the cap
    at_max: list[Probe]  # one per seed at max_rate (empty when max_rate is 0)
    at_failing: list[Probe]  # one per seed at first_failing_rate
    per_seed: list[PlanResult]

    @property
    def seeds(self) -> list[int]:
        return [r.probes[0].seed for r in self.per_seed]

    @property
    def spread(self) -> tuple[float, float]:
        """(lowest, highest) of the seeds' own highest passing rates."""
        rates = [r.max_rate for r in self.per_seed]
        return min(rates), max(rates)

    def replicas(self, target_rate: float) -> int | None:
        return replicas_for(target_rate, self.max_rate)


def find_max_rate_all_seeds(
    config: EngineConfig,
    spec: WorkloadSpec,
    cls: GoodputClass,
    seeds: list[int] | tuple[int, ...],
    *,
    start_rate: float = 1.0,
    tolerance: float = 0.02,
    faults: Callable[[], FaultState] | None = None,
    on_probe: OnProbe | None = None,
    on_running: OnRunning | None = None,
) -> SeedsResult:
    """Search each seed's workload, then the highest rate every one of them passes (see the module's docstring)."""
    if not seeds:
        raise ValueError("--seeds: at least one seed")
    prober = _Prober(config, cls, faults, on_probe, on_running)
    specs = [dataclasses.replace(spec, seed=s) for s in seeds]
    per_seed = [find_max_rate(config, s, cls, start_rate=start_rate, tolerance=tolerance, _prober=prober)
                for s in specs]

    def every_seed(rate: float) -> bool:
        return all(prober(s, rate).passed for s in specs)  # stops at the first seed that fails

    rate = min(r.max_rate for r in per_seed)
    failing = [r.first_failing_rate for r in per_seed if r.first_failing_rate is not None]
    hi: float | None = min(failing) if failing else None
    if rate > 0 and not every_seed(rate):  # a seed that passed higher fails here: search below, all seeds at once
        rate, hi = search_rate(every_seed, rate, tolerance, MIN_RATE, rate)
    at_max = [prober(s, rate) for s in specs] if rate > 0 else []
    at_failing = [prober(s, hi) for s in specs] if hi is not None else []
    return SeedsResult(config.deployment.name, cls, rate, hi, at_max, at_failing, per_seed)


def _worst(probes: list[Probe]) -> float | None:
    return min(p.attainment for p in probes) if probes else None


def result_dict(result: SeedsResult, target_rate: float | None) -> dict:
    """A JSON-ready view of one preset's result; attainments are the worst seed's."""
    low, high = result.spread
    return {
        "preset": result.preset,
        "seeds": result.seeds,
        "max_rate_per_replica": result.max_rate,
        "attainment_at_max": _worst(result.at_max),
        "requests_at_max": min(p.requests for p in result.at_max) if result.at_max else None,
        "first_failing_rate": result.first_failing_rate,
        "attainment_at_first_failing": _worst(result.at_failing),
        "seeds_meeting_at_first_failing": sum(p.passed for p in result.at_failing) if result.at_failing else None,
        "per_seed": [{"seed": seed, "max_rate": r.max_rate, "first_failing_rate": r.first_failing_rate}
                     for seed, r in zip(result.seeds, result.per_seed, strict=True)],
        "spread": {"min_max_rate": low, "max_max_rate": high},
        "target_rate": target_rate,
        "replicas": result.replicas(target_rate) if target_rate is not None else None,
        "probes": [dataclasses.asdict(p) | {"attainment": p.attainment} for r in result.per_seed for p in r.probes],
    }


def render_table(results: list[SeedsResult], target_rate: float | None, header: str) -> str:
    """A small text table, one row per preset: the rate every seed meets, the worst seed's attainment there,
    the lowest failing rate with how many seeds still met it, and the spread of the seeds' own answers."""
    lines = [header]
    title = (f"{'preset':<20} {'max req/s':>10} {'attain.':>8} {'fails at':>10} {'attain.':>8} {'seeds met':>10} "
             f"{'per-seed max req/s':>20}")
    if target_rate is not None:
        title += " " + f"replicas for {target_rate:g} req/s".rjust(24)
    lines.append(title)
    for r in results:
        low, high = r.spread
        met = f"{sum(p.passed for p in r.at_failing)} of {len(r.at_failing)}" if r.at_failing else "-"
        row = (f"{r.preset:<20} {_fmt(r.max_rate):>10} {_pct(_worst(r.at_max)):>8} "
               f"{_fmt(r.first_failing_rate, up=True):>10} {_pct(_worst(r.at_failing)):>8} {met:>10} "
               f"{_fmt(low) + ' .. ' + _fmt(high):>20}")
        if target_rate is not None:
            n = r.replicas(target_rate)
            row += f" {'none meets it' if n is None else str(n):>24}"
        lines.append(row)
    return "\n".join(lines)


def _fmt(rate: float | None, up: bool = False) -> str:
    """Two decimals, rounded toward safety: a passing rate down, a failing rate up."""
    if rate is None:
        return "-"
    return f"{(math.ceil if up else math.floor)(rate * 100 - (1e-6 if up else -1e-6)) / 100:.2f}"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"
