"""LLMEngineRefusingRequests: the engine itself refuses requests at its own queue caps or overload (issue #37, part 4).

Its generated promtool test stages vLLM refusing at a queue cap next to a client's own refusals, a restart, a partial
counter reset and one burst; the rule passes it, and mutants that would page for a healthy engine, or stay silent
while one refuses, fail it."""

from __future__ import annotations

import pytest
import yaml

from llmslo import conventions as c
from llmslo.durations import MINUTE
from slogen.artifacts import dashboards
from slogen.cli import main
from slogen.errors import SpecErrors
from slogen.panels import REFUSALS_TITLE, WAITING_BY_REASON_TITLE
from slogen.rules.health import HealthOptions
from tests.helpers.dashboards import iter_queries
from tests.slogen.test_health import REPO, RULES, TESTS, files_for, promtool_test, rules_of

ALERT = c.HEALTH.ENGINE_REFUSING_REQUESTS
REASONS = "max_num_queued_reqs|max_num_queued_tokens|other|overloaded|REJECTED|http_429|http_503"
REFUSED = f'{c.REQUESTS_REJECTED.name}{{reason=~"{REASONS}"}}'


def test_the_rule_selects_the_engines_own_refusals_and_is_a_ticket():
    rule = rules_of(files_for(HealthOptions()))[ALERT]
    assert rule["expr"].strip() == f"rate({REFUSED}[5m]) > 0"
    assert "|".join(c.ENGINE_REFUSAL_REASONS) == REASONS
    # a client's own refusals are never the engine's capacity
    assert not {"validation", "template", "http_400", "http_404", "http_422"} & set(c.ENGINE_REFUSAL_REASONS)
    assert set(c.VLLM.ADMISSION_REJECTION_REASONS) < set(c.ENGINE_REFUSAL_REASONS)
    assert rule["for"] == "10m" and rule["labels"]["severity"] == "warning"
    desc = rule["annotations"]["description"]
    assert "--max-num-queued-reqs" in desc and "503" in desc and "{{ $labels.reason }}" in desc
    assert rule["annotations"]["runbook_url"].endswith(f"docs/runbooks/{ALERT}.md")


def test_the_generated_test_passes_and_mutants_fail_it(promtool, tmp_path):
    files = files_for(HealthOptions())
    doc = yaml.safe_load(files[TESTS])
    (test,) = [t for t in doc["tests"] if t["name"].startswith(ALERT + ":")]
    checks = [(ch["eval_time"], bool(ch["exp_alerts"])) for ch in test["alert_rule_test"]]
    assert checks == [("9m", False), ("19m", False), ("20m", True), ("24m", True), ("30m", False)]
    fired = [a["exp_labels"] for ch in test["alert_rule_test"] for a in ch["exp_alerts"]]
    assert all(f == fired[0] for f in fired) and fired[0]["reason"] == "max_num_queued_reqs"
    assert fired[0]["pod"] == "vllm-0" and fired[0]["severity"] == "warning"
    proc = promtool_test(promtool, files, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    text = files[RULES]
    mutants = {
        # pages for a healthy engine: clients' own 4xx, a restart's counter, one burst or a partial reset
        "client reasons": text.replace(f'reason=~"{REASONS}"', 'reason=~".+"'),
        "no rate": text.replace(f"rate({REFUSED}[5m]) > 0", f"{REFUSED} > 0"),
        "short for": text.replace(f"{REFUSED}[5m]) > 0\n    for: 10m", f"{REFUSED}[5m]) > 0\n    for: 4m"),
        "long window": text.replace(f"{REFUSED}[5m]", f"{REFUSED}[15m]"),
        # silent while the engine refuses
        "known reasons only": text.replace(f'reason=~"{REASONS}"', 'reason=~"overloaded|REJECTED"'),
        "threshold": text.replace(f"{REFUSED}[5m]) > 0\n", f"{REFUSED}[5m]) > 1\n"),
    }
    for what, mutant in mutants.items():
        assert mutant != text, what
        proc = promtool_test(promtool, {**files, RULES: mutant}, tmp_path)
        assert proc.returncode != 0, what


def test_options_reach_the_rule_and_its_test(promtool, tmp_path):
    opts = HealthOptions(engine_refusal_rate=0.5, engine_refusal_window=2 * MINUTE, engine_refusal_for=3 * MINUTE)
    files = files_for(opts)
    rule = rules_of(files)[ALERT]
    assert rule["expr"].strip() == f"rate({REFUSED}[2m]) > 0.5" and rule["for"] == "3m"
    assert "at more than 0.5 per second (over 2m)" in rule["annotations"]["description"]
    proc = promtool_test(promtool, files, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_for_no_longer_than_the_window_is_refused_with_the_fix():
    with pytest.raises(SpecErrors) as e:
        files_for(HealthOptions(engine_refusal_for=5 * MINUTE, engine_refusal_rate=-1))
    text = str(e.value)
    assert "engine_refusal_for is 5m, not longer than engine_refusal_window (5m)" in text
    assert "--engine-refusal-for" in text and "engine_refusal_rate is -1" in text


def test_the_flags_set_it(tmp_path):
    out = tmp_path / "out"
    assert main(["build", str(REPO / "slos"), "--out", str(out), "--engine-refusal-rate", "0.2",
                 "--engine-refusal-window", "10m", "--engine-refusal-for", "30m"]) == 0
    rules = {r["alert"]: r for g in yaml.safe_load((out / RULES).read_text())["groups"] for r in g["rules"]}
    assert "[10m]) > 0.2\n" in rules[ALERT]["expr"] and rules[ALERT]["for"] == "30m"


def test_the_fleet_dashboard_shows_the_engines_refusals_beside_the_taps():
    models = dict(dashboards.iter_dashboard_models([]))
    fleet = next(model for path, model in models.items() if "fleet" in path)
    queries = [expr for title, expr in iter_queries(fleet) if title == REFUSALS_TITLE]
    assert len(queries) == 2
    engine, tap = queries
    assert f"rate({c.REQUESTS_REJECTED.name}{{" in engine and f"rate({c.TAP_REFUSALS.name}{{" in tap
    assert all(f"{c.LABEL_REASON})" in expr or f", {c.LABEL_REASON}" in expr for expr in queries)  # by reason
    waiting = [expr for title, expr in iter_queries(fleet) if title == WAITING_BY_REASON_TITLE]
    assert len(waiting) == 1 and c.REQUESTS_WAITING_BY_REASON.name in waiting[0]
