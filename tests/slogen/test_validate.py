"""Validation: Sloth's good/bad fixtures, duplicates, and errors that name file, SLO, field and fix."""

from __future__ import annotations

import textwrap

import pytest

from slogen.cli import main
from slogen.errors import SpecErrors
from slogen.loaders import load_paths
from tests.helpers.specs import events_sli, load_path


def test_every_good_fixture_is_accepted(sloth_testdata, capsys):
    good = sorted((sloth_testdata / "validate" / "good").glob("*.yaml"))
    assert len(good) == 7
    for f in good:
        assert main(["validate", str(f)]) == 0, capsys.readouterr().err
    # The good files share SLO ids, so as a directory they validate only with duplicates allowed (as in Sloth).
    assert main(["validate", "--ignore-slo-duplicates", str(sloth_testdata / "validate" / "good")]) == 0
    assert main(["validate", str(sloth_testdata / "validate" / "good")]) == 1


@pytest.mark.parametrize("name,field,slo", [
    ("bad-aa.yaml", "slos[1].objective", "svc01-slo02"),
    ("bad-ab.yaml", "slos[1].objective", "svc01-slo02"),
    ("bad-ba.yaml", "slos[1].objective", "svc01-slo02"),
    ("bad-k8s.yaml", "spec.service", ""),
    ("bad-multi-k8s.yaml", "spec.slos[0].alerting.name", "svc01-slo1"),
    ("bad-multi.yaml", "slos[1].sli", "svc02-slo02"),
])
def test_every_bad_fixture_is_rejected_with_file_slo_and_field(sloth_testdata, name, field, slo):
    path = sloth_testdata / "validate" / "bad" / name
    with pytest.raises(SpecErrors) as e:
        load_path(path)
    err = e.value.errors[0]
    assert err.file == str(path) and err.field == field and err.slo == slo and err.fix and err.line
    # the line points at the `# BAD!` marker
    assert "BAD!" in path.read_text().splitlines()[err.line - 1] or name == "bad-k8s.yaml"


def test_bad_openslo_is_accepted_now_that_28d_exists(sloth_testdata):
    assert len(load_path(sloth_testdata / "validate" / "bad" / "bad-openslo.yaml")) == 1


@pytest.mark.parametrize("sub", ["k8s", "openslo", "prom", "bad-prom-multi-duplicates.yaml"])
def test_duplicates_are_rejected(sloth_testdata, sub, capsys):
    path = sloth_testdata / "validate_with_duplicates" / sub
    with pytest.raises(SpecErrors) as e:
        load_path(path)
    assert any("already defined" in err.message for err in e.value.errors)
    assert main(["validate", str(path)]) == 1
    assert main(["validate", "--ignore-slo-duplicates", str(path)]) == 0


def write(tmp_path, text: str, name: str = "spec.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


BASE = """\
version: "prometheus/v1"
service: "svc"
slos:
  - name: "avail"
    objective: 99.9
    labels: {LABELS}
""" + events_sli("req_total") + """    alerting:
      name: SvcAvail
"""


def test_user_labels_cannot_clobber_generator_labels(tmp_path):
    p = write(tmp_path, BASE.replace("{LABELS}", "{sloth_id: mine, slo_tier: x, team: a}"))
    with pytest.raises(SpecErrors) as e:
        load_path(p)
    fields = sorted(err.field for err in e.value.errors)
    assert fields == ["slos[0].labels.slo_tier", "slos[0].labels.sloth_id"]
    assert all("reserved" in err.message and err.slo == "svc-avail" for err in e.value.errors)


def test_extra_labels_cannot_clobber_either(tmp_path, capsys):
    p = write(tmp_path, BASE.replace("{LABELS}", "{}"))
    assert main(["generate", "-i", str(p), "-l", "sloth_service=x"]) == 2
    assert "reserved" in capsys.readouterr().err


def test_many_problems_are_reported_at_once(tmp_path):
    p = write(tmp_path, """\
        version: "prometheus/v1"
        service: "bad service"
        slos:
          - name: "a"
            objective: 0.999x
            sli: {events: {error_query: "sum(rate(x[5m]))", total_query: "sum(rate(y[{{.window}}])"}}
            alerting: {name: "has space"}
        """)
    with pytest.raises(SpecErrors) as e:
        load_path(p)
    msgs = {err.field: err for err in e.value.errors}
    assert set(msgs) >= {"service", "slos[0].objective", "slos[0].sli.events.error_query",
                         "slos[0].sli.events.total_query", "slos[0].alerting.name"}
    assert "{{.window}}" in msgs["slos[0].sli.events.error_query"].message
    assert "unclosed" in msgs["slos[0].sli.events.total_query"].message
    text = str(msgs["slos[0].alerting.name"])
    assert text.startswith(f"{p}:7: SLO 'bad service-a': field slos[0].alerting.name:") and "(fix:" in text


def test_plugin_option_errors_name_the_option(tmp_path):
    p = write(tmp_path, """\
        version: "prometheus/v1"
        service: "chat"
        slos:
          - name: "ttft"
            objective: 99
            sli: {plugin: {id: llmslo/latency, options: {metric: ttft, threshold: "0.5", treshold_typo: "1"}}}
            alerting: {page_alert: {disable: true}, ticket_alert: {disable: true}}
          - name: "tpot"
            objective: 99
            sli: {plugin: {id: llmslo/nope}}
            alerting: {page_alert: {disable: true}, ticket_alert: {disable: true}}
        """)
    with pytest.raises(SpecErrors) as e:
        load_path(p)
    a, b = e.value.errors
    assert a.field == "slos[0].sli.plugin.options.treshold_typo" and "threshold" in a.fix
    assert b.field == "slos[1].sli.plugin.id" and "llmslo/latency" in b.fix


def test_unknown_keys_warn_with_did_you_mean(sloth_testdata):
    loaded = load_paths([sloth_testdata / "validate" / "good" / "good-aa.yaml"])
    assert any("did you mean page_alert" in w.fix for w in loaded.warnings)


def test_yaml_syntax_error_names_the_line(tmp_path):
    p = write(tmp_path, "version: prometheus/v1\nslos: [\n  - a: b\n")
    with pytest.raises(SpecErrors) as e:
        load_path(p)
    assert e.value.errors[0].line and "YAML" in e.value.errors[0].message
