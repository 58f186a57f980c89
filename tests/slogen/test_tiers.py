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


# Files in other tools' formats load as those tools load them: Sloth and OpenSLO emit a dead tier as it is.
SLOTH_90 = ('version: "prometheus/v1"\nservice: s1\nslos:\n  - name: a1\n    description: events SLI\n'
            '    objective: 90\n    sli:\n      events:\n        error_query: sum(rate(x{code="5"}[{{.window}}]))\n'
            '        total_query: sum(rate(x[{{.window}}]))\n    alerting: {name: A}\n')
OPENSLO_90 = """\
apiVersion: openslo/v1
kind: SLO
metadata: {name: a1}
spec:
  service: s1
  indicator:
    metadata: {name: ok}
    spec:
      ratioMetric:
        bad: {metricSource: {type: Prometheus, spec: {query: 'sum(rate(x{code="5"}[{{.window}}]))'}}}
        total: {metricSource: {type: Prometheus, spec: {query: 'sum(rate(x[{{.window}}]))'}}}
  objectives:
    - target: 0.9
  alertPolicies:
    - kind: AlertPolicy
      metadata: {name: pager}
      spec:
        alertWhenBreaching: true
        conditions:
          - kind: AlertCondition
            metadata: {name: fast}
            spec: {severity: page, condition: {kind: burnrate, op: gt, threshold: 14.4, lookbackWindow: 1h}}
"""


@pytest.mark.parametrize("text, line, field", [(SLOTH_90, 6, "slos[0].objective"),
                                               (OPENSLO_90, 13, "spec.objectives[0].target")])
def test_another_tools_file_warns_of_a_dead_tier_and_strict_refuses_it(tmp_path, capsys, text, line, field):
    from slogen.cli import main

    path = tmp_path / "spec.yaml"
    path.write_text(text)
    assert text.splitlines()[line - 1].strip().startswith(("objective:", "- target:"))
    for command in (["validate", "--no-autoscaling"], ["generate", "--llm-extras", "-o", str(tmp_path / "o.yaml"), "-i"]):
        assert main([*command, str(path)]) == 0
        err = capsys.readouterr().err
        assert f"warning: {path}:{line}: SLO 's1-a1" in err and f"field {field}" in err
        assert "page-quick alert tier can never fire" in err and "--strict" in err
        assert main([*command[:1], "--strict", *command[1:], str(path)]) == 1
        assert f"{path}:{line}:" in capsys.readouterr().err
    out = tmp_path / "build"
    assert main(["build", "--no-autoscaling", "--out", str(out), str(path)]) == 0
    assert "page-quick alert tier can never fire" in capsys.readouterr().err
    assert main(["build", "--strict", "--no-autoscaling", "--out", str(tmp_path / "b2"), str(path)]) == 1


def test_slogens_own_spec_still_refuses_a_dead_tier_at_the_objective_line(tmp_path):
    from slogen.errors import SpecErrors
    from slogen.loaders import load_paths
    from slogen.rules import generate

    path = tmp_path / "own.yaml"
    path.write_text('version: "prometheus/v1"\nservice: s1\nslos:\n  - name: a1\n    objective: 90\n'
                    '    sli: {plugin: {id: llmslo/availability}}\n    alerting: {name: A}\n')
    with pytest.raises(SpecErrors) as e:
        generate(load_paths([path]).slos, GenOptions())
    [err] = e.value.errors
    assert (err.line, err.field) == (5, "slos[0].objective") and "can never fire" in err.message
