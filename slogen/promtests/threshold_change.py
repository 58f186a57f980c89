"""A tap-sourced latency SLO's threshold changed on running taps (issue 35): the generated tests that the old
configuration's series stopping and the new ones starting at 0 neither fire a healthy SLO nor hide a hurt one."""

from __future__ import annotations

from dataclasses import dataclass

from llmslo import conventions as c
from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration
from llmslo.sli_plugins import SOURCE_TAP, LatencyParams
from slogen.model import EventsSLI, SeriesFixture, Tier
from slogen.plugins.llm import le_label
from slogen.promtests.checks import Scenario, alert_checks
from slogen.promtests.series import UNITS_PER_STEP, encode, value_text
from slogen.promtests.simulate import Simulation, simulate
from slogen.rules import SLOResult
from slogen.rules.alerts import no_data_alert_name

CHANGE_SUBSTEPS = 5  # samples per evaluation in the healthy change, so that the tap reloads between two of them
CHANGE_SAMPLE = 2  # ... at this sample of its evaluation step
BUDGET_TOLERANCE = 1e-9
BEFORE, AFTER = "before", "after"  # the LABEL_BUCKETS values of the old and the new configuration's series


def threshold_change_groups(r: SLOResult, fixtures: tuple[SeriesFixture, ...], step: int, history: int,
                            tiers: list[Tier], split: str) -> list[dict]:
    """A tap-sourced latency SLO's threshold changes on running taps (docs/deploy.md, step 3): the old
    configuration's histogram series (LABEL_BUCKETS=before) lack the new threshold's bucket and stop at the
    change; the new ones (after) start at 0 with it. Healthy, nothing may fire and the period budget may not
    fall; every request slower than the new threshold after the change, the tiers fire when simulate() says."""
    sli = r.slo.sli
    if not (isinstance(sli, EventsSLI) and isinstance(sli.params, LatencyParams) and sli.params.source == SOURCE_TAP):
        return []
    total = next((f for f in fixtures if f.role == "total"), None)
    good = next((f for f in fixtures if f.role == "good"), None)
    if total is None or good is None:
        return []
    sets = _ChangeSeries(total, good, le_label(sli.params.threshold), le_label(round(sli.params.threshold * 1.25, 6)))
    out = [_healthy_change(r, sets, step, history, split)] if step % CHANGE_SUBSTEPS == 0 else []
    hurt = _hurt_change(r, fixtures, sets, step, history, tiers, split)
    return out + ([hurt] if hurt else [])


@dataclass(frozen=True)
class _ChangeSeries:
    """The SLI's histogram as the tap exposes it across the change: the old series' buckets are at the old
    threshold (`old_le`) and not at the new one (`new_le`, the SLI's); each set has its own LABEL_BUCKETS."""

    total: SeriesFixture
    good: SeriesFixture
    new_le: str
    old_le: str

    def series(self, where: dict[str, str], buckets: str, count: str, within: str) -> list[dict]:
        """One configuration's set: `_count`, the bucket at its threshold and +Inf (`count`, `within`: values)."""
        le = self.new_le if buckets == AFTER else self.old_le
        labels = {**where, c.LABEL_BUCKETS: buckets}
        return [{"series": _series_name(self.total.name, {**self.total.labels, **labels}), "values": count},
                {"series": _series_name(self.good.name, {**self.good.labels, **labels, c.LABEL_LE: le}), "values": within},
                {"series": _series_name(self.good.name, {**self.good.labels, **labels, c.LABEL_LE: "+Inf"}),
                 "values": count}]


def _series_name(name: str, labels: dict[str, str]) -> str:
    return f"{name}{{{','.join(f'{k}={chr(34)}{v}{chr(34)}' for k, v in sorted(labels.items()))}}}"


def _recorded_history(r: SLOResult, where: dict[str, str], samples: int, every: int, step: int) -> list[dict]:
    """What the rules before the change recorded from the old series: the base window's error and request
    rates (clean traffic, UNITS_PER_STEP a step), one sample per evaluation (`every` samples) up to sample
    `samples`. The derived windows and the period budget sum them, as Prometheus keeps them past the change."""
    base = format_prometheus_duration(r.ctx.base_window)
    out = []
    for name, value in ((C.sli_errors_rate(base), 0.0), (C.sli_total_rate(base), UNITS_PER_STEP / (step / 1000))):
        rule = next(x for x in r.rules.sli.rules if x.record == name)
        values = " ".join(value_text(value) if k % every == 0 else "_" for k in range(1, samples + 1))
        out.append({"series": _series_name(name, {**rule.labels, **where}), "values": "_ " + values})
    return out


def _healthy_change(r: SLOResult, sets: _ChangeSeries, step: int, history: int, split: str) -> dict:
    """Every request faster than both thresholds; the tap reloads between two evaluations, so that a `_count`
    which went on past the change (the old design: one series set, the new bucket born at the reload) would put
    the requests just before it in the next base window as too slow, and the period budget would fall."""
    every, sub = CHANGE_SUBSTEPS, step // CHANGE_SUBSTEPS
    change = history * every + CHANGE_SAMPLE  # the sample at which the tap reloads
    end = (2 * history + 2) * every  # a longest page window after the change, and more
    per = value_text(UNITS_PER_STEP / every)
    where = {split: "threshold-change"} if split else {}
    old, new = f"0+{per}x{change - 1} stale", f"_x{change} 0+{per}x{end - change}"
    series = (sets.series(where, BEFORE, old, old) + sets.series(where, AFTER, new, new)
              + _recorded_history(r, where, history * every, every, step))
    alert = next(x.alert for x in r.rules.alerts.rules if x.labels.get(C.LABEL_TIER) != "no-data")
    budget = _series_name(C.PERIOD_ERROR_BUDGET_REMAINING, {**r.slo.id_labels, **where})
    since = format_prometheus_duration(end * sub - history * step)  # back to the last evaluation before the change
    at = format_prometheus_duration(end * sub)
    name = (f"{r.slo.id}: threshold changed on running taps ({sets.old_le} s -> {sets.new_le} s) after "
            f"{format_prometheus_duration(history * step)} of clean traffic, between two evaluations: the old "
            f"configuration's series (no le={sets.new_le}) stop, the new ones start at 0 with it; every request fast: "
            f"{alert} never fires and the period error budget stays at its value before the change")
    return {"name": name, "interval": format_prometheus_duration(sub), "input_series": series,
            "promql_expr_test": [
                {"expr": f'max_over_time(ALERTS{{alertname="{alert}",alertstate="firing"}}[{at}])', "eval_time": at,
                 "exp_samples": []},
                {"expr": f"min(min_over_time({budget}[{since}]) - {budget} offset {since}) >= bool {-BUDGET_TOLERANCE!r}",
                 "eval_time": at, "exp_samples": [{"labels": "{}", "value": 1}]}],
            "alert_rule_test": [{"eval_time": at, "alertname": name_, "exp_alerts": []}
                                for name_ in (alert, no_data_alert_name(alert))]}


def _hurt_change(r: SLOResult, fixtures: tuple[SeriesFixture, ...], sets: _ChangeSeries, step: int, history: int,
                 tiers: list[Tier], split: str) -> dict | None:
    """Every request slower than the new threshold from the change on: the rules never measured the old
    configuration (no bucket at their threshold), so their windows start at the change, and the tiers fire when
    simulate() says for traffic that starts there (then recover)."""
    sim, bad = _change_run(r.ctx, tiers, step, history)
    if sim is None:
        return None
    n = len(bad)
    where = {split: "threshold-change"} if split else {}
    old = f"0+{value_text(UNITS_PER_STEP)}x{history - 1} stale"
    good, acc = [], 0.0
    for k in range(history, n):
        acc += (1.0 - bad[k]) * UNITS_PER_STEP if k > history else 0.0
        good.append(acc)
    new = f"_x{history} 0+{value_text(UNITS_PER_STEP)}x{n - 1 - history}"
    series = sets.series(where, BEFORE, old, old) + sets.series(where, AFTER, new, f"_x{history} {encode(good)}")
    pq = next((t for t in tiers if sim.fire_steps(t.name)), None)
    fires = "" if pq is None else (f": {pq.name} fires {format_prometheus_duration((sim.fire_steps(pq.name)[0] - history) * step)} "
                                   f"after the change")
    scenario = Scenario("threshold-change", "", bad, sim)
    return {"name": (f"{r.slo.id}: threshold changed on running taps ({sets.old_le} s -> {sets.new_le} s) after "
                     f"{format_prometheus_duration(history * step)} of clean traffic, every request slower than "
                     f"{sets.new_le} s from then on{fires}"),
            "interval": format_prometheus_duration(step), "input_series": series,
            "alert_rule_test": alert_checks(r, fixtures, step, [scenario], split, n)}


def _change_run(ctx, tiers: list[Tier], step: int, history: int) -> tuple[Simulation | None, list[float]]:
    """The hurt change's simulation: no measured traffic up to the change (step `history`), then UNITS_PER_STEP
    requests a step, all bad until every tier that fires has fired (+5 steps), then clean until all resolve."""
    longest_long = max(t.window.long_window for t in tiers) // step
    recovery = max(t.window.short_window for t in ctx.tiers) // step * 2 + 10

    def run(burn: int, clean: int) -> tuple[Simulation, list[float]]:
        bad = [0.0] * (history + 1) + [1.0] * burn + [0.0] * clean
        traffic = [0.0] * (history + 1) + [UNITS_PER_STEP] * (burn + clean)
        return simulate(ctx, tiers, bad, step, False, traffic=traffic), bad

    sim, _ = run(longest_long, 0)
    fired = [sim.fire_steps(t.name)[0] for t in tiers if sim.fire_steps(t.name)]
    if not fired:
        return None, []
    sim, bad = run(max(fired) - history + 5, recovery)
    last = max((s[-1] for name in sim.states for s in [sim.resolve_steps(name)] if s), default=len(bad) - 1)
    burn = max(fired) - history + 5
    sim, bad = run(burn, last + 3 - (history + 1 + burn))
    return sim, bad
