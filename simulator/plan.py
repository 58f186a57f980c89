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
  first failing rate until they are within `tolerance` of each other.

Replicas for a target rate = ceil(target / per-replica rate), assuming the load spreads evenly and
replicas do not interact (no shared prefix cache, no cross-replica queueing). docs/capacity.md says
how far to trust the numbers.

The simulator does not import the exporter: the two comparisons and the SLO-file reading are
repeated here (through the shared reader `llmslo.specfile`), and tests/simulator/test_plan.py
checks that they agree with the tap's `within_objectives` and `load_slo_config`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from llmslo.sli_plugins import GOODPUT as GOODPUT_PLUGIN
from llmslo.sli_plugins import GoodputParams, PluginOptionError, read_options
from llmslo.ranges import ALLOW_KEY
from llmslo.specfile import SpecFileError, discover, read_documents
from simulator.config import EngineConfig
from simulator.faults import FaultState
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


def within_objectives(ttft: float | None, tpot: float | None, ttft_max: float | None, tpot_max: float | None) -> bool:
    """The tap's rule for a completed, streamed request (exporter.tap.timing.within_objectives)."""
    if ttft is None or tpot is None:
        return False
    return (ttft_max is None or ttft <= ttft_max) and (tpot_max is None or tpot <= tpot_max)


def request_timings(req: Request) -> tuple[float | None, float | None]:
    """TTFT and TPOT of a finished request, as the tap measures them (None: no output)."""
    if req.num_output_tokens < 1:
        return None, None
    ttft = req.first_token_time - req.arrival_time
    n = req.num_output_tokens
    tpot = (req.last_token_time - req.first_token_time) / (n - 1) if n > 1 else 0.0
    return ttft, tpot


class _GoodCounter:
    """Observer counting finished requests and the good ones."""

    def __init__(self, cls: GoodputClass) -> None:
        self.cls = cls
        self.finished = 0
        self.good = 0

    def on_step(self, core: Any, stats: Any) -> None:
        pass

    def on_finished(self, req: Request) -> None:
        self.finished += 1
        if req.finish_reason in (FINISH_STOP, FINISH_LENGTH) and within_objectives(
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

    @property
    def attainment(self) -> float:
        return self.good / self.requests if self.requests else 1.0


def probe(config: EngineConfig, spec: WorkloadSpec, cls: GoodputClass, rate: float,
          faults: Callable[[], FaultState] | None = None) -> Probe:
    """Run `spec` at `rate` through one replica; pass when good / all >= the objective."""
    run_spec = dataclasses.replace(spec, rate=rate)
    counter = _GoodCounter(cls)
    run = simulate(config, run_spec, ttft_slo=cls.ttft or math.inf, tpot_slo=cls.tpot or math.inf,
                   faults=faults() if faults else None, observers=(counter,))
    total = counter.finished + run.summary["unfinished"]  # an unfinished request is not good
    passed = total > 0 and counter.good * 100.0 >= cls.objective * total
    return Probe(rate, total, counter.good, passed)


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


def find_max_rate(
    config: EngineConfig,
    spec: WorkloadSpec,
    cls: GoodputClass,
    *,
    start_rate: float = 1.0,
    tolerance: float = 0.02,
    min_rate: float = 0.01,
    max_rate_cap: float = 10_000.0,
    faults: Callable[[], FaultState] | None = None,
) -> PlanResult:
    """Coarse (doubling or halving from `start_rate`) then fine (bisection to `tolerance`, relative)."""
    if not 0 < tolerance < 1:
        raise ValueError(f"--tolerance: {tolerance} must be between 0 and 1")
    if start_rate <= 0:
        raise ValueError(f"--start-rate: {start_rate} must be positive")
    probes: list[Probe] = []

    def run(rate: float) -> bool:
        p = probe(config, spec, cls, rate, faults)
        probes.append(p)
        return p.passed

    lo, hi = 0.0, None  # lo passes (0 trivially), hi fails
    rate = start_rate
    if run(rate):
        lo = rate
        while hi is None and rate < max_rate_cap:
            rate = min(rate * 2, max_rate_cap)
            if run(rate):
                lo = rate
            else:
                hi = rate
    else:
        hi = rate
        while lo == 0.0 and rate > min_rate:
            rate = max(rate / 2, min_rate)
            if run(rate):
                lo = rate
            else:
                hi = rate
    if hi is not None and lo > 0:
        while (hi - lo) > tolerance * hi:
            mid = (lo + hi) / 2
            if run(mid):
                lo = mid
            else:
                hi = mid
    return PlanResult(config.deployment.name, cls, lo, hi, probes)


def result_dict(result: PlanResult, target_rate: float | None) -> dict:
    """A JSON-ready view of one preset's result."""
    best, failing = result.best, result.failing
    return {
        "preset": result.preset,
        "max_rate_per_replica": result.max_rate,
        "attainment_at_max": best.attainment if best else None,
        "requests_at_max": best.requests if best else None,
        "first_failing_rate": result.first_failing_rate,
        "attainment_at_first_failing": failing.attainment if failing else None,
        "target_rate": target_rate,
        "replicas": result.replicas(target_rate) if target_rate is not None else None,
        "probes": [dataclasses.asdict(p) | {"attainment": p.attainment} for p in result.probes],
    }


def render_table(results: list[PlanResult], target_rate: float | None, header: str) -> str:
    """A small text table, one row per preset."""
    lines = [header]
    title = f"{'preset':<20} {'max req/s':>10} {'attain.':>8} {'fails at':>10} {'attain.':>8}"
    if target_rate is not None:
        title += " " + f"replicas for {target_rate:g} req/s".rjust(24)
    lines.append(title)
    for r in results:
        best, failing = r.best, r.failing
        row = (f"{r.preset:<20} {_fmt(r.max_rate):>10} {_pct(best.attainment if best else None):>8} "
               f"{_fmt(r.first_failing_rate, up=True):>10} {_pct(failing.attainment if failing else None):>8}")
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
