"""Validation holes a new user hit (issue 35), each with the exact message `slogen validate` gives: a label the
rules group by written anywhere (SLO, spec, alerting, page/ticket alert labels, -l), a latency threshold written
as a duration, every bad value of one SLI in one run, and an autoscaling pool whose match.namespace is not its own
namespace, reported beside the other problems of its pool."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from slogen.cli import main

LATENCY = '{plugin: {id: llmslo/latency, options: {metric: ttft, threshold: "0.5"}}}'
GOODPUT = "{plugin: {id: llmslo/goodput, options: {%s}}}"


def spec(sli: str = LATENCY, *, labels: str = "", alerting: str = "alerting: {name: ChatTtft}", head: str = "") -> str:
    """One Sloth prometheus/v1 file of service chat with one SLO, ttft, on line 4; its `sli:` on line 6."""
    body = f"objective: 99\nsli: {sli}\n{labels}{alerting}\n"
    return (f'version: "prometheus/v1"\nservice: chat\n{head}slos:\n  - name: ttft\n'
            + textwrap.indent(body, "    "))


def validate(tmp_path: Path, capsys, text: str, *flags: str) -> tuple[int, list[str]]:
    """The exit code and the `error:` lines of `slogen validate`, the file written as chat.yaml."""
    path = tmp_path / "slos" / "chat.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    code = main(["validate", "--no-autoscaling", *flags, str(path)])
    err = capsys.readouterr().err.replace(str(path), "chat.yaml")
    return code, [line for line in err.splitlines() if line.startswith("error: ")]


GROUPED = ("label '{key}' is one the SLI's rules group by (sum by ({by})): a fixed value would overwrite each "
           "series' own {key}, and a ruler that sees two would fail every recording rule (fix: remove the label "
           "(the series keep their own {key}) or rename it (e.g. slo_{key}))")
GROUPED_ALERT = ("label '{key}' is one the SLI's rules group by (sum by ({by})): on an alert it would overwrite "
                 "each alert's own {key}, and when two burn at once Prometheus fails the rule (vector contains "
                 "metrics with the same labelset after applying alert labels): neither pages (fix: remove the label "
                 "(each alert keeps its series' own {key}) or rename it (e.g. slo_{key}))")
CLUSTER = {"key": "cluster", "by": "cluster"}
BY = "cluster, region"

# case -> (spec text, the exact error lines of `slogen validate`)
HOLES = {
    "cluster under the SLO's labels": (
        spec(labels="labels: {team: chat, cluster: prod-a}\n"),
        [f"error: chat.yaml:7: SLO 'chat-ttft': field slos[0].labels.cluster: {GROUPED.format(**CLUSTER)}"]),
    "cluster under the spec's labels": (
        spec(head="labels: {cluster: prod-a}\n"),
        [f"error: chat.yaml:3: SLO 'chat-ttft': field labels.cluster: {GROUPED.format(**CLUSTER)}"]),
    "cluster under alerting.labels": (
        spec(alerting="alerting:\n  name: ChatTtft\n  labels:\n    team: chat\n    cluster: prod-a"),
        ["error: chat.yaml:11: SLO 'chat-ttft': field slos[0].alerting.labels.cluster: "
         + GROUPED_ALERT.format(**CLUSTER)]),
    "cluster under page_alert.labels": (
        spec(alerting="alerting:\n  name: ChatTtft\n  page_alert: {labels: {cluster: prod-a}}"),
        ["error: chat.yaml:9: SLO 'chat-ttft': field slos[0].alerting.page_alert.labels.cluster: "
         + GROUPED_ALERT.format(**CLUSTER)]),
    "cluster under ticket_alert.labels": (
        spec(alerting="alerting:\n  name: ChatTtft\n  ticket_alert:\n    labels: {cluster: prod-a}"),
        ["error: chat.yaml:10: SLO 'chat-ttft': field slos[0].alerting.ticket_alert.labels.cluster: "
         + GROUPED_ALERT.format(**CLUSTER)]),
    "a label of the plugin's own `by`, everywhere at once": (
        spec(LATENCY.replace('"0.5"', '"0.5", by: "cluster,region"'), labels="labels: {region: eu}\n",
             alerting="alerting: {name: ChatTtft, labels: {region: eu}, page_alert: {labels: {cluster: a}}}"),
        [f"error: chat.yaml:7: SLO 'chat-ttft': field slos[0].labels.region: {GROUPED.format(key='region', by=BY)}",
         "error: chat.yaml:8: SLO 'chat-ttft': field slos[0].alerting.labels.region: "
         + GROUPED_ALERT.format(key="region", by=BY),
         "error: chat.yaml:8: SLO 'chat-ttft': field slos[0].alerting.page_alert.labels.cluster: "
         + GROUPED_ALERT.format(key="cluster", by=BY)]),
    "a TTFT threshold written as milliseconds": (
        spec(LATENCY.replace('"0.5"', '"800ms"')),
        ["error: chat.yaml:6: SLO 'chat-ttft': field slos[0].sli.plugin.options.threshold: plugin llmslo/latency: "
         "option 'threshold' is '800ms', a duration: it takes plain seconds (fix: write threshold: \"0.8\")"]),
    "an e2e threshold written as seconds with a unit": (
        spec(LATENCY.replace("ttft", "e2e").replace('"0.5"', '"1.2s"')),
        ["error: chat.yaml:6: SLO 'chat-ttft': field slos[0].sli.plugin.options.threshold: plugin llmslo/latency: "
         "option 'threshold' is '1.2s', a duration: it takes plain seconds (fix: write threshold: \"1.2\")"]),
    "goodput's ttft and tpot both in milliseconds: both, in one run": (
        spec(GOODPUT % 'slo_class: interactive, ttft: "800ms", tpot: "50ms"'),
        ["error: chat.yaml:6: SLO 'chat-ttft': field slos[0].sli.plugin.options.ttft: plugin llmslo/goodput: "
         "option 'ttft' is '800ms', a duration: it takes plain seconds (fix: write ttft: \"0.8\")",
         "error: chat.yaml:6: SLO 'chat-ttft': field slos[0].sli.plugin.options.tpot: plugin llmslo/goodput: "
         "option 'tpot' is '50ms', a duration: it takes plain seconds (fix: write tpot: \"0.05\")"]),
    "goodput without a class and with a tpot out of range: both, each at its own line": (
        spec("\n  plugin:\n    id: llmslo/goodput\n    options:\n      ttft: \"0.5\"\n      tpot: \"50\""),
        ["error: chat.yaml:9: SLO 'chat-ttft': field slos[0].sli.plugin.options.slo_class: plugin llmslo/goodput: "
         "option 'slo_class' is missing: plugin llmslo/goodput needs it (fix: set slo_class: \"<the tap class "
         "name>\", e.g. \"interactive\")",
         "error: chat.yaml:11: SLO 'chat-ttft': field slos[0].sli.plugin.options.tpot: plugin llmslo/goodput: "
         "option 'tpot': 50 looks like milliseconds: write 0.05 (a TPOT threshold is in seconds, plausibly 0.001 "
         "to 2) (fix: write tpot: \"0.05\", or set allow_out_of_range: true on the SLO to keep 50)"]),
}


@pytest.mark.parametrize("case", list(HOLES))
def test_each_hole_is_refused_with_its_exact_messages(tmp_path, capsys, case):
    text, expected = HOLES[case]
    code, errors = validate(tmp_path, capsys, text)
    assert (code, errors) == (1, expected)


def test_a_user_events_sli_groups_by_nothing_so_a_cluster_label_is_kept(tmp_path, capsys):
    events = "{events: {error_query: 'sum(rate(e[{{.window}}]))', total_query: 'sum(rate(t[{{.window}}]))'}}"
    text = spec(events, alerting="alerting: {name: ChatTtft, labels: {cluster: prod-a}}")
    assert validate(tmp_path, capsys, text) == (0, [])


def test_the_flag_l_is_refused_per_slo(tmp_path, capsys):
    code, errors = validate(tmp_path, capsys, spec(), "-l", "cluster=prod-a")
    assert (code, errors) == (1, [
        "error: -l cluster=prod-a: SLO 'chat-ttft': field -l: label 'cluster' is one the SLI's rules of SLO chat-ttft "
        "group by (sum by (cluster)): a fixed value would overwrite each series' own cluster (fix: drop -l "
        "cluster=... or rename it (e.g. slo_cluster))"])


POOL = """version: "llmslo/autoscaling/v1"
pools:
  - name: p
    namespace: llm
    target: {name: d}
    replicas: {max: 4}
    match: {namespace: %s, model: m}
    triggers:
      %s
"""
NO_SLO = ("field pools[0].triggers.ttft_burn_rate.slo: no SLO 'chat/nope' (fix: use service/slo-name of a defined "
          "SLO (defined: chat/ttft))")
OTHER_NAMESPACE = ("field pools[0].match.namespace: 'llm-b' is not the pool's namespace 'llm': the pool would scale "
                   "its target in llm on the load of the engines in llm-b (fix: write namespace: llm here (the "
                   "namespace the target's engine pods run in), or move the pool to namespace: llm-b)")

# case -> (autoscaling spec text, the exact error lines of `slogen validate`, the file written as pools.yaml)
POOL_HOLES = {
    "a pool matching engines in another namespace": (
        POOL % ("llm-b", "queue_depth: {per_replica: 4}"),
        [f"error: pools.yaml:7: {OTHER_NAMESPACE}"]),
    "the SLO a pool names, behind the pool's other problems": (
        (POOL % ("llm-b", "ttft_burn_rate: {slo: chat/nope, above: 2}")).replace("max: 4", "max: 0"),
        ["error: pools.yaml:6: field pools[0].replicas.max: expected a whole number at least 1, got 0 (fix: write a "
         "whole number at least 1)",
         f"error: pools.yaml:7: {OTHER_NAMESPACE}",
         f"error: pools.yaml:9: {NO_SLO}"]),
    "the SLO a pool names, behind a wake that cannot be read": (
        POOL % ("llm", "ttft_burn_rate: {slo: chat/nope, above: 2}") + "    wake: {}\n",
        ["error: pools.yaml:10: field pools[0].wake: needs exactly one of query and metric (fix: name a request "
         "metric of the gateway or ingress in front of the pool, which exists at zero replicas: `wake: {metric: "
         "<its request counter>, selector: {<label>: <value>}}` or `wake: {query: <PromQL giving requests per "
         "second>}` (docs/autoscaling.md, \"Scale to zero\"))",
         f"error: pools.yaml:9: {NO_SLO}"]),
}


@pytest.mark.parametrize("case", list(POOL_HOLES))
def test_each_pool_hole_is_refused_with_its_exact_messages(tmp_path, capsys, case):
    text, expected = POOL_HOLES[case]
    (tmp_path / "slos").mkdir()
    (tmp_path / "slos" / "chat.yaml").write_text(spec())
    (tmp_path / "autoscaling").mkdir()
    path = tmp_path / "autoscaling" / "pools.yaml"
    path.write_text(text)
    code = main(["validate", str(tmp_path / "slos")])
    err = capsys.readouterr().err.replace(str(path), "pools.yaml")
    assert (code, [line for line in err.splitlines() if line.startswith("error: ")]) == (1, expected)


def test_a_pool_matching_its_own_namespace_passes(tmp_path, capsys):
    (tmp_path / "slos").mkdir()
    (tmp_path / "slos" / "chat.yaml").write_text(spec())
    (tmp_path / "autoscaling").mkdir()
    (tmp_path / "autoscaling" / "pools.yaml").write_text(POOL % ("llm", "ttft_burn_rate: {slo: chat/ttft, above: 2}"))
    assert main(["validate", str(tmp_path / "slos")]) == 0
