"""Tier reachability: a tier whose factor x (1 - objective) >= 1 can never fire; fail or rescale."""

from __future__ import annotations

import pytest

from llmslo.conventions import SLO as C
from slogen.errors import SpecError
from slogen.model import SLO, Alerting, AlertMeta, EventsSLI, Origin
from slogen.rules import generate_slo
from slogen.rules.options import RESCALE_CEILING, GenOptions

SLI = EventsSLI('sum(rate(x{code="5"}[{{.window}}]))', "sum(rate(x[{{.window}}]))")


def slo(objective: float, page: bool = True) -> SLO:
    on = AlertMeta(name="A", disable=False)
    return SLO(id="s-t", service="s", name="t", objective=objective, sli=SLI,
               alerting=Alerting("A", on if page else AlertMeta(), on),
               origin=Origin(file="slos/s.yaml", path="slos[0]", line=3))


def test_90_percent_objective_fails_with_an_explanation():
    with pytest.raises(SpecError) as e:
        generate_slo(slo(90), GenOptions())
    err = e.value
    assert err.file == "slos/s.yaml" and err.slo == "s-t" and err.field == "slos[0].objective" and err.line == 3
    assert "page-quick" in err.message and "14.4" in err.message and "10x" in err.message
    assert "--unreachable-tiers rescale" in err.fix


def test_95_percent_objective_keeps_every_tier():
    res = generate_slo(slo(95), GenOptions())
    tiers = {r.labels[C.LABEL_TIER] for r in res.rules.alerts.rules}
    assert tiers == {"page-quick", "page-slow", "ticket-quick", "ticket-slow", "no-data",
                     "page-quick-low-traffic", "page-slow-low-traffic"}  # the low-traffic guard's tickets


def test_disabled_severity_is_not_dead():
    res = generate_slo(slo(90, page=False), GenOptions())
    assert {r.labels[C.LABEL_TIER] for r in res.rules.alerts.rules} == {"ticket-quick", "ticket-slow", "no-data"}


def test_rescale_caps_the_threshold_below_one():
    res = generate_slo(slo(90), GenOptions(unreachable_tiers="rescale"))
    pq = next(t for t in res.ctx.tiers if t.name == "page-quick")
    assert pq.rescaled_from == pytest.approx(14.4) and pq.factor * 0.1 == pytest.approx(RESCALE_CEILING)
    rule = next(r for r in res.rules.alerts.rules if r.labels[C.LABEL_TIER] == "page-quick")
    assert "rescaled from 14.4x" in rule.annotations["description"]
    assert all(t.factor * 0.1 < 1 for t in res.ctx.tiers)


def test_sloth_compat_checks_reachability_too():
    with pytest.raises(SpecError):
        generate_slo(slo(90), GenOptions(sloth_compat=True))
