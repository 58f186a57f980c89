"""The mistakes new users make, each with the exact message it gets (issue 29): numbers in the wrong unit or
scale say so first, keys that landed in the wrong place say where they belong, a typo gets a did-you-mean,
and `--strict` turns every warning into a failed run. The tap and the exporter refuse the same numbers."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from exporter.config import ConfigError, load_config
from exporter.tap.classes import SloConfigError, load_slo_config
from exporter.tap.deadlines import derive_deadlines, log_derived
from slogen.cli import main


def slo(body: str, *, head: str = "", name: str = "ttft") -> str:
    """One Sloth prometheus/v1 file with one SLO (`body`: the SLO's fields after its name)."""
    return (f'version: "prometheus/v1"\nservice: chat\n{head}slos:\n  - name: {name}\n'
            + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n")


LATENCY = """
objective: 99
sli:
  plugin:
    id: llmslo/latency
    options: {{metric: {metric}, threshold: "{threshold}"{extra}}}
alerting:
  name: ChatTtft
"""
GOODPUT = """
objective: 95
sli:
  plugin:
    id: llmslo/goodput
    options: {{slo_class: interactive, {options}}}
alerting:
  name: ChatGoodput
"""
KV = """
objective: 99
sli:
  plugin:
    id: llmslo/kv-headroom
    options: {threshold: "90"}
alerting:
  name: ChatKv
"""


def lines(tmp_path: Path, capsys, text: str, *flags: str) -> tuple[int, list[str]]:
    path = tmp_path / "slos" / "chat.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    code = main(["validate", "--no-autoscaling", *flags, str(path)])
    return code, capsys.readouterr().err.replace(str(path), "chat.yaml").splitlines()


# (spec text, one line of stderr: exact, or its exact beginning where the rest lists what tests may add)
ERRORS = {
    "ttft in milliseconds": (
        slo(LATENCY.format(metric="ttft", threshold="500", extra="")),
        "error: chat.yaml:9: SLO 'chat-ttft': field slos[0].sli.plugin.options.threshold: plugin llmslo/latency: "
        "option 'threshold': 500 looks like milliseconds: write 0.5 (a TTFT threshold is in seconds, plausibly 0.01 "
        "to 60) (fix: write threshold: \"0.5\", or set allow_out_of_range: true on the SLO to keep 500)"),
    "engine ttft in milliseconds: the unit first, not 'write threshold 10'": (
        slo(LATENCY.format(metric="ttft", threshold="500", extra=", source: engine")),
        "error: chat.yaml:9: SLO 'chat-ttft': field slos[0].sli.plugin.options.threshold: plugin llmslo/latency: "
        "option 'threshold': 500 looks like milliseconds: write 0.5 (a TTFT threshold is in seconds, plausibly 0.01 "
        "to 60) (fix: write threshold: \"0.5\", or set allow_out_of_range: true on the SLO to keep 500)"),
    "e2e in milliseconds": (
        slo(LATENCY.format(metric="e2e", threshold="30000", extra="")),
        "error: chat.yaml:9: SLO 'chat-ttft': field slos[0].sli.plugin.options.threshold: plugin llmslo/latency: "
        "option 'threshold': 30000 looks like milliseconds: write 30 (an end-to-end latency threshold is in "
        "seconds, plausibly 0.05 to 1800) (fix: write threshold: \"30\", or set allow_out_of_range: true on the "
        "SLO to keep 30000)"),
    "goodput ttft in milliseconds": (
        slo(GOODPUT.format(options='ttft: "500"'), name="goodput"),
        "error: chat.yaml:9: SLO 'chat-goodput': field slos[0].sli.plugin.options.ttft: plugin llmslo/goodput: "
        "option 'ttft': 500 looks like milliseconds: write 0.5 (a TTFT threshold is in seconds, plausibly 0.01 to "
        "60) (fix: write ttft: \"0.5\", or set allow_out_of_range: true on the SLO to keep 500)"),
    "goodput tpot in milliseconds": (
        slo(GOODPUT.format(options='ttft: "0.5", tpot: "50"'), name="goodput"),
        "error: chat.yaml:9: SLO 'chat-goodput': field slos[0].sli.plugin.options.tpot: plugin llmslo/goodput: "
        "option 'tpot': 50 looks like milliseconds: write 0.05 (a TPOT threshold is in seconds, plausibly 0.001 "
        "to 2) (fix: write tpot: \"0.05\", or set allow_out_of_range: true on the SLO to keep 50)"),
    "kv headroom as a percentage": (
        slo(KV, name="kv"),
        "error: chat.yaml:9: SLO 'chat-kv': field slos[0].sli.plugin.options.threshold: plugin llmslo/kv-headroom: "
        "option 'threshold': 90 looks like a percentage: write 0.9 (a KV-cache usage threshold is a ratio, "
        "plausibly 0.1 to 1) (fix: write threshold: \"0.9\", or set allow_out_of_range: true on the SLO to keep 90)"),
    "objective as a ratio (no --unreachable-tiers rescale)": (
        slo(LATENCY.format(metric="ttft", threshold="0.5", extra="").replace("objective: 99", "objective: 0.99")),
        "error: chat.yaml:5: SLO 'chat-ttft': field slos[0].objective: 0.99 looks like a ratio: objectives are "
        "percentages, write 99 (an objective is a percentage, plausibly 50 to 100) (fix: write objective: 99, or "
        "set allow_out_of_range: true on the SLO to keep 0.99)"),
    "option typo": (
        slo(LATENCY.format(metric="ttft", threshold="0.5", extra="").replace("threshold:", "treshold:")),
        "error: chat.yaml:9: SLO 'chat-ttft': field slos[0].sli.plugin.options.treshold: plugin llmslo/latency: "
        "unknown option(s) treshold for plugin llmslo/latency (fix: did you mean threshold? (known: metric, "
        "threshold, source, slo_class, threshold_rounding, engine_versions, buckets, selector, models, by))"),
    "plugin id typo": (
        slo(LATENCY.format(metric="ttft", threshold="0.5", extra="").replace("llmslo/latency", "llmslo/latncy")),
        "error: chat.yaml:8: SLO 'chat-ttft': field slos[0].sli.plugin.id: unknown SLI plugin 'llmslo/latncy' (fix: "
        "did you mean llmslo/latency? use one of the built-in plugins: "),  # then the plugins registered (tests add some)
    "dedented options: the key where it landed, then the missing option": (
        slo(LATENCY.format(metric="ttft", threshold="0.5", extra="").replace(
            "    options: {metric", "  options: {metric")),
        "warning: chat.yaml:9: SLO 'chat-ttft': field slos[0].sli.options: unknown key 'options' in slos[0].sli: "
        "it belongs under sli.plugin (fix: move it under sli.plugin)"),
    "dedented options, missing metric": (
        slo(LATENCY.format(metric="ttft", threshold="0.5", extra="").replace(
            "    options: {metric", "  options: {metric")),
        "error: chat.yaml:8: SLO 'chat-ttft': field slos[0].sli.plugin.options.metric: plugin llmslo/latency: "
        "option 'metric' is missing: plugin llmslo/latency needs it (fix: set metric to one of: ttft, tpot, e2e, "
        "itl (under sli.plugin.options))"),
    "autoscaling spec among the SLOs": (
        'version: "llmslo/autoscaling/v1"\npools: []\n',
        "error: chat.yaml:1: field version: this is an autoscaling spec (version llmslo/autoscaling/v1), not an "
        "SLO spec (fix: move it to autoscaling/ or pass --autoscaling DIR naming its directory (and leave it out "
        "of the SLO inputs))"),
}

# Warnings (exit 0 without --strict): the line each gets
WARNINGS = {
    "page_alerts: {disable: true}": (
        slo(LATENCY.format(metric="ttft", threshold="0.5", extra="") + "  page_alerts: {disable: true}\n"),
        "warning: chat.yaml:12: SLO 'chat-ttft': field slos[0].alerting.page_alerts: unknown key 'page_alerts' in "
        "slos[0].alerting is ignored (fix: did you mean page_alert?)"),
    "page_alert: {disabled: true}": (
        slo(LATENCY.format(metric="ttft", threshold="0.5", extra="") + "  page_alert: {disabled: true}\n"),
        "warning: chat.yaml:12: SLO 'chat-ttft': field slos[0].alerting.page_alert.disabled: unknown key "
        "'disabled' in slos[0].alerting.page_alert is ignored (fix: did you mean disable?)"),
    "options at the SLO level": (
        slo(LATENCY.format(metric="ttft", threshold="0.5", extra="") + "options: {metric: ttft}\n"),
        "warning: chat.yaml:12: SLO 'chat-ttft': field slos[0].options: unknown key 'options' in slos[0]: it "
        "belongs under sli.plugin (fix: move it under sli.plugin)"),
    "an SLO key at the top level": (
        slo(LATENCY.format(metric="ttft", threshold="0.5", extra=""), head="objective: 99\n"),
        "warning: chat.yaml:3: field objective: unknown key 'objective' at the top level: it belongs under each "
        "SLO of slos (fix: move it under each SLO of slos)"),
    "a camelCase key": (
        slo(LATENCY.format(metric="ttft", threshold="0.5", extra="") + "  pageAlert: {disable: true}\n"),
        "warning: chat.yaml:12: SLO 'chat-ttft': field slos[0].alerting.pageAlert: unknown key 'pageAlert' in "
        "slos[0].alerting is ignored (fix: did you mean page_alert?)"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_each_mistake_gets_its_exact_message(tmp_path, capsys, case):
    text, expected = ERRORS[case]
    code, err = lines(tmp_path, capsys, text)
    assert code == 1 and any(line == expected or expected.endswith(": ") and line.startswith(expected)
                             for line in err), "\n".join(err)


@pytest.mark.parametrize("case", list(WARNINGS))
def test_each_warning_gets_its_exact_message_and_strict_fails_it(tmp_path, capsys, case):
    text, expected = WARNINGS[case]
    code, err = lines(tmp_path, capsys, text)
    assert code == 0 and expected in err, "\n".join(err)
    code, err = lines(tmp_path, capsys, text, "--strict")
    assert code == 1 and expected.replace("warning: ", "error: ", 1) in err, "\n".join(err)


@pytest.mark.parametrize("case", list(WARNINGS))
def test_strict_build_and_generate_fail_each_warning(tmp_path, capsys, case):
    text, _ = WARNINGS[case]
    path = tmp_path / "slos" / "chat.yaml"
    path.parent.mkdir()
    path.write_text(text)
    out = tmp_path / "out"
    args = ["build", "--out", str(out), "--no-promtool-check", "--no-autoscaling", "--no-health-alerts",
            "--no-capacity-rules", "--runbook-base-url", "https://wiki.llm.internal", "--grafana-url",
            "https://grafana.llm.internal", "--receiver", "llmslo-page=https://pager.llm.internal",
            "--receiver", "llmslo-ticket=https://tickets.llm.internal",
            str(path)]  # real links and receivers: the spec's warning is the only one
    assert main([*args, "--strict"]) == 1
    assert "--strict makes 1 warning(s) errors" in capsys.readouterr().err
    assert not out.exists() or not any(out.rglob("*.yaml")), "a strict build that fails writes nothing"
    assert main(["generate", "--strict", "-i", str(path), "-o", str(tmp_path / "rules.yaml")]) == 1
    assert "error: " in capsys.readouterr().err and not (tmp_path / "rules.yaml").exists()
    assert main(["generate", "-i", str(path), "-o", str(tmp_path / "rules.yaml")]) == 0
    assert "warning: " in capsys.readouterr().err, "generate says its warnings too"


def test_allow_out_of_range_keeps_a_value_on_purpose(tmp_path, capsys):
    text = slo(LATENCY.format(metric="ttft", threshold="90", extra="").replace(
        "objective: 99", "objective: 99\nallow_out_of_range: true"))
    code, err = lines(tmp_path, capsys, text, "--strict")
    assert code == 0, "\n".join(err)
    config = load_slo_config([tmp_path / "slos"])
    assert config.thresholds["ttft"] == (90.0,)


def test_the_tap_refuses_the_same_thresholds_at_start(tmp_path):
    path = tmp_path / "goodput.yaml"
    path.write_text(slo(GOODPUT.format(options='ttft: "500"'), name="goodput"))
    with pytest.raises(SloConfigError) as err:
        load_slo_config([path])
    assert str(err.value) == (
        f"{path}: SLO 'goodput': sli.plugin.options.ttft: option 'ttft': 500 looks like milliseconds: write 0.5 "
        "(a TTFT threshold is in seconds, plausibly 0.01 to 60) (fix: write ttft: \"0.5\", or set "
        "allow_out_of_range: true on the SLO to keep 500)")


def test_the_tap_logs_each_class_with_its_thresholds_and_deadlines(tmp_path, caplog):
    path = tmp_path / "goodput.yaml"
    path.write_text(slo(GOODPUT.format(options='ttft: "8", tpot: "0.05", models: "llama-*"'), name="goodput"))
    config = load_slo_config([path])
    with caplog.at_level(logging.INFO, logger="llmslo.test.tap"):
        log_derived(config, derive_deadlines(config), "llmslo.test.tap")
    assert [r.getMessage() for r in caplog.records] == [
        "event=tap_slo_class slo_class=interactive ttft_s=8 tpot_s=0.05 models=llama-* first_token_deadline_s=80 "
        "stall_deadline_s=30 response_deadline_s=600 ttft_edges_s=8 tpot_edges_s=0.05 e2e_edges_s=none "
        f"origin=\"{path}: SLO 'goodput'\""]


@pytest.mark.parametrize("value, message", [
    ("500", "field interval: 500 looks like milliseconds: write 0.5 (the exporter's collection interval is in "
            "seconds, plausibly 0.1 to 300) (fix: write 0.5 (or 500ms), or write 500s to mean 500 seconds)"),
    ("0.01", "field interval: 0.01 is outside the plausible range: the exporter's collection interval is in seconds, "
             "plausibly 0.1 to 300 (fix: write a duration such as 5s, or write 0.01s to mean 0.01 seconds)"),
])
def test_the_exporter_interval_in_the_wrong_unit(tmp_path, value, message):
    path = tmp_path / "exporter.yaml"
    path.write_text(f"interval: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, check=False)
    assert str(err.value) == f"{path}:1: {message}"
    path.write_text(f"interval: {value}s\n")
    assert load_config(path, check=False).interval_s == float(value), "a unit written out is taken as written"
