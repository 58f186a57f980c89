"""What the generated tests expect of the burn-rate alerts: a staged incident (`Scenario`) and its simulation, the
steps to check on both sides of each tier's transition, and the alerts expected firing there."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration
from slogen.model import Rule
from slogen.promtests.series import UNITS_PER_STEP, arrivals
from slogen.promtests.simulate import Simulation
from slogen.rules import SLOResult
from slogen.rules.alerts import no_data_alert_name, rendered, sli_by
from slogen.rules.scope import fired_labels


@dataclass
class Scenario:
    """One staged incident. `bad[k]` is the share of step k's requests that fail; a hang
    (`incident` set: the outcome its requests end in) fails them by never completing them."""

    key: str
    name: str
    bad: list[float]
    sim: Simulation
    incident: str = ""
    per_hour: int = 0  # requests an hour, one at a time; 0: UNITS_PER_STEP events every step
    drained_at: int = 0  # from this step on no request arrives (the traffic moved to another cluster); 0: never

    def traffic(self, step: int) -> list[float] | None:
        """Events per step, where they are not UNITS_PER_STEP every step."""
        if self.per_hour:
            return arrivals(len(self.bad), step, self.per_hour)
        if self.drained_at:
            return [UNITS_PER_STEP if k < self.drained_at else 0.0 for k in range(len(self.bad))]
        return None


def _robust(sims: list[Simulation], n: int) -> list[bool]:
    """Steps where no scenario is near a threshold."""
    each = [(len(sim.bad), sim.robust_steps()) for sim in sims]
    return [all(k >= size or robust[k] for size, robust in each) for k in range(n)]


def _checkpoints(sims: list[Simulation], n: int, robust: list[bool]) -> list[int]:
    """Steps on both sides of every tier transition where no scenario is near a threshold (`robust`)."""
    points: set[int] = set()
    for sim in sims:
        for name in sim.states:
            for k in sim.fire_steps(name) + sim.resolve_steps(name):
                before = next((j for j in range(k - 1, -1, -1) if robust[j]), None)
                after = next((j for j in range(k, n) if robust[j]), None)
                points.update(j for j in (before, after) if j is not None)
    points.add(max(j for j in range(n) if robust[j]))
    return sorted(points)


# The text of an evaluation time: the same few hundred steps for every SLO (format_prometheus_duration is pure).
_eval_time = functools.lru_cache(maxsize=4096)(format_prometheus_duration)


def alert_checks(r: SLOResult, fixtures, step: int, scenarios: list[Scenario], split: str, n: int) -> list[dict]:
    """The burn-rate alert's expected alerts at the scenarios' checkpoints (each scenario one `split` value,
    its key), and the no-data alert quiet at the end."""
    by_tier = {x.labels.get(C.LABEL_TIER): x for x in r.rules.alerts.rules}
    alert = next(x.alert for x in r.rules.alerts.rules if x.labels.get(C.LABEL_TIER) != "no-data")
    base_labels = _alert_series_labels(r, fixtures)
    checks: list[dict[str, Any]] = []
    robust = _robust([s.sim for s in scenarios], n)
    points = _checkpoints([s.sim for s in scenarios], n, robust)
    if any(s.per_hour for s in scenarios):  # low traffic: every robust evaluation, so a flap cannot hide between
        points = sorted(set(points) | {k for k in range(n) if robust[k]})
    made: dict[tuple[str, str], tuple[list, dict]] = {}  # (tier, scenario) -> (sort key, expected alert)

    def firing(name: str, s: Scenario) -> tuple[list, dict]:
        found = made.get((name, s.key))
        if found is None:
            e = expected(by_tier[name], {**base_labels, split: s.key} if split else base_labels)
            found = made[(name, s.key)] = (sorted(e["exp_labels"].items()), e)
        return found

    for k in points:
        exp = [firing(name, s) for s in scenarios for name, states in s.sim.states.items()
               if states[k].firing and name in by_tier]
        checks.append({"eval_time": _eval_time(k * step), "alertname": alert,
                       "exp_alerts": [e for _, e in sorted(exp, key=lambda pair: pair[0])]})
    checks.append({"eval_time": format_prometheus_duration((n - 1) * step), "alertname": no_data_alert_name(alert), "exp_alerts": []})
    return checks


def _alert_series_labels(r: SLOResult, fixtures) -> dict[str, str]:
    """Labels the recorded error ratios carry into the alert (ids, spec labels, passed-through labels)."""
    labels = {**r.slo.id_labels, **r.ctx.labels}
    for name in sli_by(r.slo.sli):
        values = {f.labels.get(name) for f in fixtures if name in f.labels}
        if len(values) == 1:
            labels[name] = values.pop()
    return labels


def expected(rule: Rule, series_labels: dict[str, str]) -> dict:
    return {"exp_labels": fired_labels(series_labels, rule),
            "exp_annotations": {k: rendered(v) for k, v in sorted(rule.annotations.items())}}
