"""Hostile spec files get one clear error naming the file, line, field and fix, never a traceback,
and the goodput tap (which reads the same files through the same reader) refuses them too."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.tap.classes import SloConfigError, load_slo_config
from llmslo.specfile import MAX_DEPTH, SpecFileError, load_documents
from slogen.autoscaling import AutoscalingError, load_text
from slogen.cli import main

SPEC = '''version: "prometheus/v1"
service: svc
slos:
  - name: ttft
    objective: 99
    description: "{description}"
    sli:
      plugin:
        id: llmslo/goodput
        options:
          slo_class: interactive
          ttft: "0.5"
          tpot: "0.05"
    alerting: {{name: SvcTtftBudgetBurn}}
'''


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def _refused_everywhere(capsys, path: Path, tmp_path: Path, *needles: str) -> str:
    """validate and build both exit 1 with one message containing the needles; the tap refuses the file too."""
    code, err = _run(capsys, "validate", str(path))
    assert code == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    code, err_build = _run(capsys, "build", str(path), "--out", str(tmp_path / "out"))
    assert code == 1 and "Traceback" not in err_build, err_build
    for needle in needles:
        assert needle in err_build, err_build
    assert not (tmp_path / "out").exists()
    return err


def test_non_utf8_names_the_byte_offset_line_and_column(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(SPEC.format(description="caf\xe9 SLO").encode("latin-1"))
    offset = path.read_bytes().index(b"\xe9")
    err = _refused_everywhere(capsys, path, tmp_path, f"latin1.yaml:6: not UTF-8: byte(s) e9 at byte offset {offset}",
                              "(line 6, column 22)", "fix: save the file as UTF-8")
    assert err.count("error:") == 1
    with pytest.raises(SloConfigError, match=r"latin1\.yaml:6: not UTF-8"):
        load_slo_config([path])


def test_thousand_deep_nesting_is_refused_before_python_recursion_gives_up(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text('version: "prometheus/v1"\nservice: svc\nslos:\n' + "".join(
        "  " * (i + 1) + f"- k{i}:\n" for i in range(1000)) + "  " * 1001 + "- 1\n")
    # each line opens a list and a mapping: the 65th collection opens on line 35
    _refused_everywhere(capsys, path, tmp_path, f"deep.yaml:35: nesting deeper than {MAX_DEPTH} levels",
                        "fix: flatten the document")
    flow = tmp_path / "flow.yaml"
    flow.write_text("a: " + "[" * 1000 + "]" * 1000 + "\n")
    _refused_everywhere(capsys, flow, tmp_path, "flow.yaml:1: nesting deeper than")
    with pytest.raises(SloConfigError, match="nesting deeper than"):
        load_slo_config([path])
    # the limit is a limit, not a ban on nesting
    assert load_documents("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))


def test_duplicate_key_names_the_line_of_the_second_and_of_the_first(tmp_path, capsys):
    path = tmp_path / "dup.yaml"
    text = SPEC.format(description="d").replace('          tpot: "0.05"\n', '          tpot: "0.05"\n          ttft: "5"\n')
    path.write_text(text)
    err = _refused_everywhere(capsys, path, tmp_path, "dup.yaml:14: duplicate key 'ttft' (first at line 12)",
                              "fix: keep one 'ttft' in this mapping")
    assert err.count("error:") == 1
    with pytest.raises(SloConfigError, match=r"dup\.yaml:14: duplicate key 'ttft'"):
        load_slo_config([path])


def test_merge_keys_may_still_override_what_they_merge():
    docs = load_documents("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 5\n")
    assert docs[0]["other"] == {"x": 5, "y": 2}


@pytest.mark.parametrize("text, needle", [
    ("a: &a [1, *a]\n", "alias *a refers to a node that contains it"),
    ("? [1, 2]\n: x\n", "a mapping key must be a plain value, not a list"),
    ("a: b\x01\n", "character #x0001 at line 1 is not allowed"),
    ("a: [1, 2\n", "not valid YAML"),
])
def test_other_unreadable_yaml_is_a_spec_file_error(text, needle):
    with pytest.raises(SpecFileError) as e:
        load_documents(text, "x.yaml")
    assert needle in str(e.value) and str(e.value).startswith("x.yaml:")


@pytest.mark.parametrize("plugin, options, option", [
    ("llmslo/kv-headroom", '{threshold: "nan"}', "threshold"),  # passed validate and crashed build before
    ("llmslo/latency", '{metric: ttft, threshold: "nan"}', "threshold"),
    ("llmslo/goodput", '{slo_class: interactive, ttft: "inf", tpot: "0.05"}', "ttft"),
    ("llmslo/goodput", "{slo_class: interactive, ttft: .nan, tpot: \"0.05\"}", "ttft"),
])
def test_non_finite_plugin_options_are_refused_by_validate_and_build(tmp_path, capsys, plugin, options, option):
    path = tmp_path / "nan.yaml"
    path.write_text(f'version: "prometheus/v1"\nservice: svc\nslos:\n  - name: sli\n    objective: 99\n'
                    f'    sli: {{plugin: {{id: {plugin}, options: {options}}}}}\n    alerting: {{name: SvcBudgetBurn}}\n')
    _refused_everywhere(capsys, path, tmp_path, f"nan.yaml:6: SLO 'svc-sli': field slos[0].sli.plugin.options.{option}",
                        "not a finite number", f'fix: write {option}: "0.5"')
    if plugin == "llmslo/goodput":
        with pytest.raises(SloConfigError, match=f"options.{option}: .* is not a finite number"):
            load_slo_config([path])


def test_non_finite_plugin_option_names_the_line_of_the_option(tmp_path, capsys):
    path = tmp_path / "kv.yaml"
    path.write_text('version: "prometheus/v1"\nservice: svc\nslos:\n  - name: kv\n    objective: 99\n    sli:\n'
                    '      plugin:\n        id: llmslo/kv-headroom\n        options:\n          threshold: "nan"\n'
                    '    alerting: {name: SvcBudgetBurn}\n')
    _refused_everywhere(capsys, path, tmp_path, "kv.yaml:10: SLO 'svc-kv': field slos[0].sli.plugin.options.threshold")


@pytest.mark.parametrize("value, shown", [(".inf", ".inf"), ("-.inf", "-.inf"), (".nan", ".nan"), ('"nan"', "'nan'")])
def test_non_finite_objective_is_refused_once(tmp_path, capsys, value, shown):
    path = tmp_path / "obj.yaml"
    path.write_text(SPEC.format(description="d").replace("objective: 99", f"objective: {value}"))
    err = _refused_everywhere(capsys, path, tmp_path, "obj.yaml:5: SLO 'svc-ttft': field slos[0].objective: "
                              f"{shown} is not a finite number", "fix: write objective: 99.9")
    assert err.count("error:") == 1  # not also "objective is required"


def test_non_finite_openslo_target_is_refused(tmp_path, capsys):
    path = tmp_path / "openslo.yaml"
    path.write_text("apiVersion: openslo/v1alpha\nkind: SLO\nmetadata: {name: avail}\nspec:\n  service: svc\n"
                    "  timeWindows: [{count: 30, unit: Day}]\n  objectives:\n    - target: .nan\n      ratioMetrics:\n"
                    "        good: {source: prometheus, queryType: promql, query: 'sum(rate(ok[{{.window}}]))'}\n"
                    "        total: {source: prometheus, queryType: promql, query: 'sum(rate(all[{{.window}}]))'}\n")
    code, err = _run(capsys, "validate", str(path))
    assert code == 1 and "openslo.yaml:8:" in err and "spec.objectives[0].target: .nan is not a finite number" in err
    assert "objective is required" not in err


def test_non_finite_window_catalog_numbers_are_refused(tmp_path, capsys):
    catalog = (Path(__file__).resolve().parents[2] / "demo" / "windows.yaml").read_text()
    path = tmp_path / "w.yaml"
    path.write_text(catalog.replace("errorBudgetPercent: 5", "errorBudgetPercent: .inf", 1))
    code, err = _run(capsys, "build", str(tmp_path / "missing"), "--windows", str(path), "--out", str(tmp_path / "o"))
    assert code == 1 and "w.yaml:" in err and "spec.page.slow.errorBudgetPercent: .inf is not a finite " \
        "number" in err and "fix: write errorBudgetPercent: 2" in err
    path.write_text(catalog.replace("errorBudgetPercent: 5", "errorBudgetPercent: 500", 1))
    code, err = _run(capsys, "build", str(tmp_path / "missing"), "--windows", str(path), "--out", str(tmp_path / "o"))
    assert code == 1 and "errorBudgetPercent 500 is out of range" in err


def test_non_finite_autoscaling_numbers_are_refused():
    spec = ('version: "llmslo/autoscaling/v1"\npools:\n  - name: p\n    namespace: llm\n    target: {name: d}\n'
            "    replicas: {max: 4}\n    match: {namespace: llm}\n    triggers:\n      queue_depth: {per_replica: .inf}\n")
    with pytest.raises(AutoscalingError, match=r"pools\.yaml:9: field pools\[0\]\.triggers\.queue_depth\.per_replica: "
                                               r"\.inf is not a finite number \(fix: write a number of at least 0\.1"):
        load_text(spec, "pools.yaml")
    with pytest.raises(AutoscalingError, match=r"pools\.yaml:2: duplicate key 'version'"):
        load_text('version: "llmslo/autoscaling/v1"\nversion: x\npools: []\n', "pools.yaml")
    with pytest.raises(AutoscalingError, match=r"pools\.yaml:1: not UTF-8"):
        load_text(b"version: \"\xff\"\n", "pools.yaml")


@pytest.mark.parametrize("flag", ["--kv-usage-threshold", "--preemption-rate", "--tap-refusal-rate"])
def test_non_finite_command_line_numbers_are_usage_errors(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as e:
        main(["build", "--out", str(tmp_path), flag, "inf"])
    assert e.value.code == 2 and "not a finite number" in capsys.readouterr().err
