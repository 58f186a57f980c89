"""`slogen generate` is a drop-in for `sloth generate`: Sloth's rules by default, slogen's with --llm-extras."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slogen import VERSION_LABEL
from slogen.cli import main
from tests.slogen.test_golden import expected, version


def _alerts(text: str) -> list[dict]:
    return [r for d in yaml.safe_load_all(text) if d for g in d["groups"] for r in g["rules"] if "alert" in r]


def test_generate_without_flags_is_sloths_output(sloth_testdata, capsys):
    ver = version(capsys)
    assert main(["generate", "-i", str(sloth_testdata / "in-base.yaml")]) == 0
    out = capsys.readouterr().out
    assert list(yaml.safe_load_all(out)) == expected(sloth_testdata / "out-base.yaml.tpl", ver)
    assert sorted(a["labels"]["sloth_severity"] for a in _alerts(out)) == ["page", "ticket"]


def test_llm_extras_gives_slogens_tiers(sloth_testdata, capsys):
    assert main(["generate", "--llm-extras", "-i", str(sloth_testdata / "in-base.yaml")]) == 0
    alerts = _alerts(capsys.readouterr().out)
    assert len(alerts) > 2 and {a["labels"].get("slo_tier") for a in alerts} >= {"page-quick", "ticket-slow"}


def test_sloth_compat_is_a_noop_alias_and_contradicts_llm_extras(sloth_testdata, capsys):
    assert main(["generate", "-i", str(sloth_testdata / "in-base.yaml")]) == 0
    plain = capsys.readouterr().out
    assert main(["generate", "--sloth-compat", "-i", str(sloth_testdata / "in-base.yaml")]) == 0
    assert capsys.readouterr().out == plain
    assert main(["generate", "--sloth-compat", "--llm-extras", "-i", str(sloth_testdata / "in-base.yaml")]) == 2
    assert "--llm-extras" in capsys.readouterr().err


FOR_SPEC = Path(__file__).parent / "fixtures" / "sloth_alert_for.yaml"


def test_sloths_contrib_plugins_match_sloths_own_output(sloth_dir, capsys):
    """info_labels/v1 and rule_intervals/v1, against Sloth's examples/_gen golden (made with -l cmd=examplesgen.sh)."""
    examples = sloth_dir / "examples"
    assert main(["generate", "-l", "cmd=examplesgen.sh", "-i", str(examples / "contrib-slo-plugins.yml")]) == 0
    got = capsys.readouterr().out.replace(VERSION_LABEL, "dev")
    want = list(yaml.safe_load_all((examples / "_gen" / "contrib-slo-plugins.yml").read_text()))
    assert list(yaml.safe_load_all(got)) == want
    assert any(g.get("interval") == "5m" for d in want for g in d["groups"]), "the golden exercises rule_intervals"


@pytest.mark.parametrize("extras", [[], ["--llm-extras"]])
def test_alert_for_plugin_and_for_fields_set_for_on_the_alerts(capsys, extras):
    assert main(["generate", *extras, "-i", str(FOR_SPEC)]) == 0
    fors = {(a["labels"]["sloth_severity"], a.get("for")) for a in _alerts(capsys.readouterr().out)
            if a["alert"] == "MyServiceHighErrorRate"}
    assert fors == {("page", "10m"), ("ticket", "1h")}


def test_bad_for_and_bad_contrib_config_are_spec_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(FOR_SPEC.read_text().replace("for: 10m", "for: ten"))
    assert main(["generate", "-i", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "page_alert.for" in err and "'ten' is not a Prometheus duration" in err and "bad.yaml:" in err
    bad.write_text(FOR_SPEC.read_text().replace('- id: "sloth.dev/contrib/alert_for/v1"',
                                                '- id: "sloth.dev/contrib/rule_intervals/v1"\n          config: {}'))
    assert main(["generate", "-i", str(bad)]) == 1
    assert "interval.default is required" in capsys.readouterr().err


def test_sloth_common_plugin_gets_its_inline_events_equivalent(tmp_path, capsys):
    spec = tmp_path / "apiserver.yaml"
    spec.write_text('version: "prometheus/v1"\nservice: k8s-apiserver\nslos:\n  - name: requests-availability\n'
                    '    objective: 99.9\n    sli:\n      plugin:\n'
                    '        id: "sloth-common/kubernetes/apiserver/availability"\n'
                    '        options: {filter: \'job="apiserver"\'}\n    alerting: {name: K8sApiserverAvailability}\n')
    assert main(["generate", "-i", str(spec)]) == 1
    err = capsys.readouterr().err
    fix = err.split("write the same SLI inline: ", 1)[1].rsplit(")", 1)[0]
    assert "apiserver.yaml:8" in err
    inline = yaml.safe_load(fix)["sli"]["events"]
    assert inline == {"error_query": 'sum(rate(apiserver_request_total{job="apiserver",code=~"(5..|429)"}[{{.window}}]))',
                      "total_query": 'sum(rate(apiserver_request_total{job="apiserver"}[{{.window}}]))'}
    # the fix, pasted in, builds
    spec.write_text(spec.read_text().split("    sli:")[0] + "    sli:\n      events:\n"
                    + "".join(f"        {k}: '{v}'\n" for k, v in inline.items()) + "    alerting: {name: K8sApiserverAvailability}\n")
    assert main(["generate", "-i", str(spec)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("name", ["slo-plugin-getting-started.yml", "slo-plugin-k8s-getting-started.yml"])
def test_sloths_core_debug_plugin_is_accepted_and_output_matches_sloths(sloth_dir, capsys, name):
    """Sloth's examples chain sloth.dev/core/debug/v1 at several priorities: slogen loads them (the plugin only
    logs at Sloth's debug level) and writes Sloth's own output (examples/_gen, made with -l cmd=examplesgen.sh)."""
    examples = sloth_dir / "examples"
    assert main(["generate", "-l", "cmd=examplesgen.sh", "-i", str(examples / name)]) == 0
    got = capsys.readouterr().out.replace(VERSION_LABEL, "dev")
    assert list(yaml.safe_load_all(got)) == list(yaml.safe_load_all((examples / "_gen" / name).read_text()))


CORE_CHAIN = ("  overridePrevious: true\n  chain:\n    - id: sloth.dev/core/validate/v1\n"
              "    - id: sloth.dev/core/sli_rules/v1\n    - id: sloth.dev/core/metadata_rules/v1\n"
              "    - id: sloth.dev/core/alert_rules/v1\n    - id: sloth.dev/core/noop/v1\n")


@pytest.mark.parametrize("extras", [[], ["--llm-extras"]])
def test_sloths_default_chain_written_out_gives_the_default_rules(sloth_dir, tmp_path, capsys, extras):
    """overridePrevious drops the defaults; naming the core generators (as Sloth's victoria-metrics example
    does) brings them back, so the rules equal those of the spec without a chain."""
    src = (sloth_dir / "examples" / "getting-started.yml").read_text()
    assert "slo_plugins" not in src
    chained = tmp_path / "chained.yml"
    chained.write_text(src.replace("\nslos:\n", "\nslo_plugins:\n" + CORE_CHAIN + "slos:\n", 1))
    assert main(["generate", *extras, "-i", str(sloth_dir / "examples" / "getting-started.yml")]) == 0
    want = capsys.readouterr().out
    assert main(["generate", *extras, "-i", str(chained)]) == 0
    got = capsys.readouterr().out
    assert list(yaml.safe_load_all(got)) == list(yaml.safe_load_all(want)) and _alerts(got)
    empty = tmp_path / "empty.yml"  # without the generators, overridePrevious leaves nothing
    empty.write_text(src.replace("\nslos:\n", "\nslo_plugins:\n  overridePrevious: true\n  chain:\n"
                                 "    - id: sloth.dev/core/noop/v1\nslos:\n", 1))
    assert main(["generate", *extras, "-i", str(empty)]) == 0
    assert not _alerts(capsys.readouterr().out)


@pytest.mark.parametrize("config, why", [("{disableOptimized: true}", "disableOptimized: true is not supported"),
                                         ("{msg: 3}", "config.msg must be a str")])
def test_core_plugin_configs_slogen_cannot_follow_are_refused(tmp_path, capsys, config, why):
    plugin = "sli_rules" if "disable" in config else "debug"
    spec = tmp_path / "s.yml"
    spec.write_text(f'version: "prometheus/v1"\nservice: s1\nslo_plugins:\n  chain:\n'
                    f"    - id: sloth.dev/core/{plugin}/v1\n      config: {config}\nslos:\n  - name: a1\n"
                    "    objective: 99.9\n    sli: {events: {error_query: 'sum(rate(x{c=\"5\"}[{{.window}}]))', "
                    "total_query: 'sum(rate(x[{{.window}}]))'}}\n    alerting: {name: A}\n")
    assert main(["validate", "--no-autoscaling", str(spec)]) == 1
    assert why in capsys.readouterr().err
