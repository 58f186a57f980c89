"""Pyrra ServiceLevelObjectives: loaded as they are, converted by `slogen convert`, and paging where Pyrra pages.

Oracles (read at test time, never copied): ../shared/peers/pyrra/examples (every example loads) and
golden-rules-from-rules_test.yaml (Pyrra's expected rules, transcribed from its rules_test.go): the
windows, factors and `for:` of each case, and, through real promtool, the evaluation points at which
Pyrra's own burn-rate alerts and slogen's rules for the converted SLO start firing on the same series.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from llmslo.durations import parse_prometheus_duration
from slogen.cli import main
from slogen.errors import SpecErrors
from slogen.generate import generate_file
from slogen.loaders import load_paths
from slogen.loaders.windows import merge, pyrra
from slogen.rules.options import GenOptions
from tests.slogen.conftest import PYRRA

GOLDEN = PYRRA / "golden-rules-from-rules_test.yaml"
BURN_CASES = "burnrates_and_alerts (TestObjective_Burnrates)"


@pytest.fixture(scope="module")
def golden(pyrra_dir: Path) -> dict:
    assert GOLDEN.is_file(), f"{GOLDEN} is missing (the Pyrra peer data, ../shared/peers/pyrra)"
    return yaml.safe_load(GOLDEN.read_text())


def _input(golden: dict, case: dict) -> dict:
    """The case's input objective; the derived ones (`objectiveX + ...`) keep objectiveX's window."""
    name = case["input_objective"]
    spec = golden["inputs"][name]
    while isinstance(spec, str):
        spec = golden["inputs"][spec.split(" ", 1)[0]]
    return spec


def _ms(text: str) -> int:
    """A Go duration (`2m0s`, `1h30m0s`) or a Prometheus one, in ms."""
    return parse_prometheus_duration(re.sub(r"(?<=[hm])0s$|(?<=h)0m", "", text) if text not in ("0s",) else "0s")


def test_windows_are_pyrras_for_every_golden_case(golden: dict) -> None:
    """Short and long windows, factor, `for:` and severity of each of Pyrra's four alerts, per window."""
    checked = 0
    for case in golden[BURN_CASES]:
        alerts = [r for r in case["expected_rule_group"]["rules"] if "alert" in r]
        if not alerts:
            continue
        w = pyrra(parse_prometheus_duration(_input(golden, case)["window"]))
        assert w is not None
        tiers = [w.page_quick, w.page_slow, w.ticket_quick, w.ticket_slow]
        recorded = {_ms(m) for r in case["expected_rule_group"]["rules"] if "record" in r
                    for m in re.findall(r":burnrate(\w+)$", r["record"])}
        assert recorded == set(w.windows()), case["name"]
        for tier, severity, alert in zip(tiers, ("critical", "critical", "warning", "warning"), alerts, strict=True):
            assert _ms(alert["labels"]["short"]) == tier.short_window, case["name"]
            assert _ms(alert["labels"]["long"]) == tier.long_window, case["name"]
            assert _ms(alert["for"]) == tier.for_, case["name"]
            assert float(re.search(r"> \((\d+) \*", alert["expr"]).group(1)) == tier.factor, case["name"]
            assert alert["labels"]["severity"] == severity
            checked += 1
    assert checked >= 60  # 20 cases with alerts, 4 alerts each (two are alerting-disabled)


def _examples() -> list[Path]:
    return sorted((PYRRA / "examples").rglob("*.yaml"))


def test_every_example_loads(pyrra_dir: Path) -> None:
    files = _examples()
    assert len(files) >= 28
    for path in files:
        loaded = load_paths([path])
        assert loaded.slos, path
        for slo in loaded.slos:
            assert slo.windows is not None and slo.windows.period == slo.period
            assert slo.origin.spec == "pyrra.dev/v1alpha1"


def _line_of(path: Path, prefix: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith(prefix))


def test_examples_load_as_pyrra_loads_them_and_a_target_of_90_warns(pyrra_dir: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A 90% target makes Pyrra's 14x tier unreachable (14 x 10% > 100%); Pyrra accepts the file and emits the
    alert, so slogen does too, with a warning at the target's own line; --strict makes it an error."""
    caddy = pyrra_dir / "examples" / "caddy-response-latency.yaml"
    assert main(["validate", "--no-autoscaling", str(caddy)]) == 0
    err = capsys.readouterr().err
    line = _line_of(caddy, "target:")
    assert line > 1
    assert f"warning: {caddy}:{line}:" in err and "field spec.target" in err
    assert "page-quick alert tier can never fire" in err and "14 x 0.1 = 1.4" in err and "--strict" in err
    assert main(["validate", "--strict", "--no-autoscaling", str(caddy)]) == 1
    assert f"error: {caddy}:{line}:" in capsys.readouterr().err
    for path in _examples():
        assert main(["validate", "--no-autoscaling", str(path)]) == 0, path
        capsys.readouterr()


def test_a_dead_tier_of_a_pyrra_file_is_emitted_as_pyrra_emits_it(pyrra_dir: Path) -> None:
    """Not rescaled, not dropped: the 14x page alert of a 90% target is there, as in Pyrra's rules."""
    text = generate_file(str(pyrra_dir / "examples" / "caddy-response-latency.yaml"), GenOptions())
    alerts = [r for d in yaml.safe_load_all(text) if d for g in d["groups"] for r in g["rules"] if "alert" in r]
    [quick] = [a for a in alerts if a["labels"]["slo_tier"] == "page-quick"]
    assert "> (14 * 0.1)" in quick["expr"] and quick["labels"]["severity"] == "critical"


def test_errors_name_file_line_field_and_fix_all_at_once(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: pyrra.dev/v1alpha1\nkind: ServiceLevelObjective\nmetadata:\n  name: api\n"
        "spec:\n  target: 'ninety'\n  window: 3x\n  indicator:\n    latency:\n"
        "      success:\n        metric: http_request_duration_seconds_count\n"
        "      total:\n        metric: rate(http_request_duration_seconds_count[5m])\n"
        "  ruleOutput:\n    shortRulesLabels: {prometheus: k8s}\n"
        "  alerting:\n    severities: {fastBurn: critical, mediumBurn: high}\n")
    with pytest.raises(SpecErrors) as e:
        load_paths([bad])
    got = {(x.field, x.line) for x in e.value.errors}
    assert ("spec.target", 6) in got
    assert ("spec.window", 7) in got
    assert ("spec.indicator.latency.total.metric", 13) in got  # not a vector selector
    assert ("spec.ruleOutput.shortRulesLabels", 15) in got
    assert ("spec.alerting.severities.mediumBurn", 17) in got
    assert all(x.fix and x.file == str(bad) for x in e.value.errors)


def test_convert_cli(pyrra_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "converted.yaml"
    src = pyrra_dir / "examples" / "pyrra-connect-errors.yaml"
    assert main(["convert", str(src), "-o", str(out)]) == 0
    loaded = load_paths([out])
    assert [s.id for s in loaded.slos] == ["monitoring-pyrra-connect-errors"]
    [w] = loaded.windows
    assert (w.period, w.page_quick, w.ticket_slow) == (pyrra(w.period).period, pyrra(w.period).page_quick,
                                                       pyrra(w.period).ticket_slow)
    # The directly loaded SLO and the converted one make the same burn alerts.
    direct = generate_file(str(src), GenOptions())
    converted = generate_file(str(out), GenOptions(windows=merge(loaded.windows)))
    assert _alert_rules(direct) == _alert_rules(converted)
    assert main(["convert", str(tmp_path)]) == 1  # a directory holding only a converted (Sloth) file
    assert "is a prometheus/v1 spec, not a Pyrra one" in capsys.readouterr().err
    assert main(["convert", str(src), "-o", str(tmp_path)]) == 2
    assert "--out" in capsys.readouterr().err


def _alert_rules(text: str) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(text) if d]
    return [r for d in docs for g in d["groups"] for r in g["rules"]
            if "alert" in r and not r["alert"].endswith("NoData")]


# ------------------------------------------------------------------ firing points, through promtool

STEP = 30  # s: the evaluation interval (Pyrra's rule groups use 30s) and the input series' step
HEALTHY = 2 * 3600  # s of healthy traffic before the incident
INCIDENT = 4 * 3600  # s of the incident evaluated
PER_STEP = 300  # requests per step; during the incident 20% of them fail (the up gauge: 1 target in 5)

_SCENARIO = {
    # case: (series written from the metric selectors: (series, healthy increment, incident increment))
    "http-ratio": [('http_requests_total{job="thanos-receive-default",code="200"}', PER_STEP, PER_STEP * 4 // 5),
                   ('http_requests_total{job="thanos-receive-default",code="500"}', 0, PER_STEP // 5)],
    "operator-ratio": [("prometheus_operator_reconcile_operations_total", PER_STEP, PER_STEP),
                       ("prometheus_operator_reconcile_errors_total", 0, PER_STEP // 5)],
    "grpc-latency": [('grpc_server_handling_seconds_count{job="api",grpc_service="conprof.WritableProfileStore",'
                      'grpc_method="Write"}', PER_STEP, PER_STEP),
                     ('grpc_server_handling_seconds_bucket{job="api",grpc_service="conprof.WritableProfileStore",'
                      'grpc_method="Write",le="0.6"}', PER_STEP, PER_STEP * 4 // 5)],
    "prometheus-up-targets": [(f'up{{job="node",instance="n{i}"}}', None, None) for i in range(5)],
}


def _series(case: str, start: int) -> list[dict]:
    healthy, incident = start // STEP, INCIDENT // STEP
    out = []
    for i, (name, before, during) in enumerate(_SCENARIO[case]):
        if before is None:  # a bool gauge: target n0 goes down with the incident (1 in 5 samples bad)
            values = f"1x{healthy} " + (f"0x{incident}" if i == 0 else f"1x{incident}")
        else:
            values = f"0+{before}x{healthy} {before * healthy}+{during}x{incident}"
        out.append({"series": name, "values": values})
    return out


def _onsets(promtool: str, tmp: Path, rules: str, case: str, start: int, tier_of) -> dict[tuple[int, int], int]:
    """When each tier (short, long windows in ms) first fires: promtool reports every alert it got at each
    evaluation point where it expected none."""
    rule_file = tmp / "rules.yaml"
    rule_file.write_text(rules)
    times = range(STEP, start + INCIDENT, STEP)
    tests = {"rule_files": [rule_file.name], "evaluation_interval": f"{STEP}s",
             "tests": [{"interval": f"{STEP}s", "input_series": _series(case, start),
                        "alert_rule_test": [{"eval_time": f"{t}s", "alertname": "ErrorBudgetBurn", "exp_alerts": []}
                                            for t in times]}]}
    (tmp / "test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    run = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp, capture_output=True, text=True, timeout=600)
    text = run.stdout + run.stderr
    assert "FAILED" in text or run.returncode == 0, text[-3000:]
    onsets: dict[tuple[int, int], int] = {}
    for block in re.split(r"alertname: ErrorBudgetBurn, time: ", text)[1:]:
        t = _ms(block.split(",", 1)[0]) // 1000
        for labels in re.findall(r"Labels:\{([^}]*)\}", block.split("alertname: ", 1)[0]):
            tier = tier_of(dict(re.findall(r'(\w+)="([^"]*)"', labels)))
            onsets[tier] = min(onsets.get(tier, t), t)
    return onsets


@pytest.mark.parametrize("case_name", sorted(_SCENARIO))
def test_converted_slo_pages_where_pyrra_pages(case_name: str, golden: dict, promtool: str, tmp_path: Path) -> None:
    case = next(c for c in golden[BURN_CASES] if c["name"] == case_name)
    spec = _input(golden, case)
    pyrra_doc = {"apiVersion": "pyrra.dev/v1alpha1", "kind": "ServiceLevelObjective",
                 "metadata": {"name": spec["name"]},
                 "spec": {"target": repr(round(spec["target"] * 100, 6)), "window": spec["window"],
                          "indicator": spec["indicator"]}}
    src = tmp_path / "pyrra.yaml"
    src.write_text(yaml.safe_dump(pyrra_doc, sort_keys=False))
    converted = tmp_path / "converted.yaml"
    assert main(["convert", str(src), "-o", str(converted)]) == 0
    loaded = load_paths([converted])
    ours = generate_file(str(converted), GenOptions(windows=merge(loaded.windows)))
    group = {k: v for k, v in case["expected_rule_group"].items() if k != "interval"}
    theirs = yaml.safe_dump({"groups": [group]}, sort_keys=False)

    start = HEALTHY
    (tmp_path / "pyrra").mkdir()
    (tmp_path / "slogen").mkdir()
    expected = _onsets(promtool, tmp_path / "pyrra", theirs, case_name, start,
                       lambda labels: (_ms(labels["short"]), _ms(labels["long"])))
    got = _onsets(promtool, tmp_path / "slogen", ours, case_name, start,
                  lambda labels: (_ms(labels["short_window"]), _ms(labels["long_window"])))
    w = loaded.windows[0]
    tiers = [(t.short_window, t.long_window) for t in (w.page_quick, w.page_slow, w.ticket_quick, w.ticket_slow)]
    assert sorted(expected) == sorted(tiers), expected  # the scenario makes every one of Pyrra's alerts fire
    assert all(t > start for t in expected.values())  # and none before the incident
    # Windows up to the longest page window are raw ratios, as Pyrra's: the same evaluation point, within one
    # interval. Longer ones (the tickets' 12h, 1d, 2d, 4d) are slogen's sums of its base-window rates, whose
    # edges weigh the events of one base window partially (docs/slogen.md): within that window more.
    base, raw_up_to = w.page_quick.short_window // 1000, max(w.page_quick.long_window, w.page_slow.long_window)
    for tier in tiers:
        assert tier in got, (tier, got)
        slack = STEP if tier[1] <= raw_up_to else STEP + base
        assert abs(got[tier] - expected[tier]) <= slack, (tier, got, expected)


def _page_quick(rules: dict, slo: str) -> dict:
    return next(r for g in rules["groups"] for r in g["rules"]
                if r.get("alert") and r["labels"].get("slo_tier") == "page-quick" and r["labels"].get("slo") == slo)


def _lint(promtool: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, "check", "rules", "--lint=all", "--lint-fatal", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_converted_examples_build_validate_and_generate_with_pyrras_windows_lint_clean(
        pyrra_dir: Path, promtool: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every example, converted into one file (4w, 2w, 1w catalogs: 4w is the built-in 28d's period): build,
    validate and generate all use Pyrra's windows (14x page tier, `for: 2m` at 4w; the built-in 28d would be
    13.44x without `for:`), and every rule file they write passes promtool's duplicate-rules lint."""
    converted = tmp_path / "converted.yaml"
    assert main(["convert", str(pyrra_dir / "examples"), "-o", str(converted)]) == 0
    assert "sloPeriod: 4w" in converted.read_text()
    assert main(["validate", "--no-autoscaling", str(converted)]) == 0
    out = tmp_path / "out"
    assert main(["build", "--no-autoscaling", "--out", str(out), str(converted)]) == 0, capsys.readouterr().err
    files = sorted((out / "alerts").glob("*.rules.yaml"))
    assert len(files) >= 4
    for path in files:
        lint = _lint(promtool, path)
        assert lint.returncode == 0, (path, lint.stdout + lint.stderr)
    built = yaml.safe_load((out / "alerts" / "pyrra.rules.yaml").read_text())
    caddy = _page_quick(built, "caddy-response-latency")  # window: 4w
    assert (caddy["for"], caddy["labels"]["long_window"]) == ("2m", "1h") and "> (14 * 0.1)" in caddy["expr"]
    capsys.readouterr()
    assert main(["generate", "--llm-extras", "-i", str(converted), "-o", str(tmp_path / "gen.yaml")]) == 0
    docs = [d for d in yaml.safe_load_all((tmp_path / "gen.yaml").read_text()) if d]
    assert len(docs) >= 4
    for i, doc in enumerate(docs):
        one = tmp_path / f"gen-{i}.yaml"
        one.write_text(yaml.safe_dump(doc))
        lint = _lint(promtool, one)
        assert lint.returncode == 0, lint.stdout + lint.stderr
    caddy = _page_quick(next(d for d in docs if "caddy" in yaml.safe_dump(d)), "caddy-response-latency")
    assert caddy["for"] == "2m" and "> (14 * 0.1)" in caddy["expr"]


def test_a_converted_catalog_equal_to_another_is_no_conflict_and_a_different_one_is(tmp_path: Path) -> None:
    """Built-in entries give way to a loaded catalog in build (a base is passed) as in validate (none is)."""
    four_weeks = pyrra(parse_prometheus_duration("4w"))
    assert four_weeks is not None
    assert merge([four_weeks], None)[four_weeks.period] is four_weeks
    from slogen.loaders.windows import BUILTIN

    assert merge([four_weeks, four_weeks], dict(BUILTIN))[four_weeks.period] is four_weeks
    other = pyrra(parse_prometheus_duration("4w") + 60_000)
    assert other is not None
    from dataclasses import replace

    with pytest.raises(SpecErrors, match="already loaded"):
        merge([four_weeks, replace(other, period=four_weeks.period, source="b.yaml")], dict(BUILTIN))


DUPLICATES = """\
version: prometheus/v1
service: s1
slos:
- name: alpha
  objective: 99
  sli: {events: {error_query: 'sum(rate(x{c="5"}[{{.window}}]))', total_query: 'sum(rate(x[{{.window}}]))'}}
  alerting: {name: Burn}
- name: beta
  objective: 99
  sli: {events: {error_query: 'sum(rate(y{c="5"}[{{.window}}]))', total_query: 'sum(rate(y[{{.window}}]))'}}
  alerting: {name: Burn}
"""


def test_converts_lint_check_reports_what_promtool_reports(promtool: str, tmp_path: Path) -> None:
    """The check convert runs on what it writes (slogen.convert.lint_problems) finds the duplicates promtool's
    lint finds: two SLOs of a service sharing an alert name and labels."""
    from slogen.convert import lint_problems

    problems = lint_problems(DUPLICATES)
    assert problems and all("duplicates" in p.message and "Burn" in p.message for p in problems)
    rules = tmp_path / "rules.yaml"
    rules.write_text(generate_file(str(_write(tmp_path / "in.yaml", DUPLICATES)), GenOptions()))
    assert _lint(promtool, rules).returncode == 3
    fixed = DUPLICATES.replace("{name: Burn}", "{name: Burn, labels: {slo: alpha}}", 1)
    fixed = fixed.replace("{name: Burn}", "{name: Burn, labels: {slo: beta}}")
    assert lint_problems(fixed) == []
    rules.write_text(generate_file(str(_write(tmp_path / "in2.yaml", fixed)), GenOptions()))
    assert _lint(promtool, rules).returncode == 0


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
