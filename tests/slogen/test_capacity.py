"""KV seats (alerts/llmslo-capacity.rules.yaml): the recorded seats on every engine kind's page, the options,
and the generated promtool tests (a pool filling up pages; a full but stable one does not)."""

from __future__ import annotations

import dataclasses
import math
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from exporter import adapters
from exporter.promtext import parse
from llmslo import conventions as c
from llmslo.conventions import CAPACITY as K
from llmslo.durations import MINUTE
from slogen.build import BuildOptions
from slogen.catalog import compile_catalog
from slogen.cli import main
from slogen.errors import SpecErrors
from slogen.gofmt import label_filter
from slogen.rules.capacity import CapacityOptions, capacity_alerts, capacity_group
from slogen.steps import capacity_rules
from slogen.writers import rule_file
from tests.exporter.sample_pages import SAMPLE_PAGES, SHARED_PAGES
from tests.helpers.needs import shared_dir

RULES = f"alerts/{K.GROUP}.rules.yaml"
TESTS = f"alerts/{K.GROUP}.test.yaml"
# Engines whose pages carry free blocks, block size and both request-size histograms get seats.
WITH_SEATS = {"vllm-v1.prom", "vllm-v1-0.10-transition.prom", "vllm-v0-legacy.prom", "sglang.prom",
              "triton-trtllm-extended.prom"}


def _promtool_test(promtool: str, files: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def _quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus's histogram_quantile over cumulative bucket counts by upper bound."""
    edges = sorted(buckets)
    counts = [buckets[e] for e in edges]
    if len(edges) < 2 or counts[-1] == 0:
        return math.nan
    rank = q * counts[-1]
    b = next(i for i, n in enumerate(counts) if n >= rank)
    if b == len(edges) - 1:
        return edges[-2]
    start, below = (0.0, 0.0) if b == 0 else (edges[b - 1], counts[b - 1])
    return start + (edges[b] - start) * (rank - below) / (counts[b] - below)


def test_seats_on_every_engine_page(promtool, tmp_path):
    """Each engine kind's page through its adapter, held for 10 minutes (request counters growing at the page's
    counts per minute), then the recorded seats against free blocks x block size / (q prompt + q output)."""
    shared_dir(SHARED_PAGES, "engine sample pages")
    opts = CapacityOptions()
    series, checks = [], []
    for page, kind in SAMPLE_PAGES.items():
        pod = page.removesuffix(".prom")
        ident = {c.LABEL_POD: pod, c.LABEL_NAMESPACE: "llm", c.LABEL_NODE: "n", c.LABEL_MODEL: "m", c.LABEL_ENGINE: kind}
        adapter = adapters.get(kind)
        samples = adapter.adapt(parse((SHARED_PAGES / page).read_text(), adapter.wanted), ident)
        free = size = None
        hist: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for s in samples:
            if s.metric == c.KV_BLOCKS_FREE:
                free, values = s.value, f"{s.value:g}x10"
            elif s.metric == c.KV_BLOCK_SIZE:
                size, values = s.value, f"{s.value:g}x10"
            elif s.metric in (c.REQUEST_PROMPT_TOKENS, c.REQUEST_GENERATION_TOKENS) and s.suffix == "_bucket":
                hist[s.metric.name][float(s.labels[c.LABEL_LE])] += s.value
                values = f"0+{s.value:g}x10"
            else:
                continue
            series.append({"series": s.name + label_filter(s.labels), "values": values})
        sel = label_filter({c.LABEL_POD: pod})
        has = free is not None and size is not None and len(hist) == 2
        assert has == (page in WITH_SEATS), page
        if not has:
            checks.append({"expr": f"absent({K.SEATS_P99}{sel})", "eval_time": "10m", "exp_samples": [{"labels": sel, "value": 1}]})
            continue
        for q, name in ((0.99, K.SEATS_P99), (0.5, K.SEATS_P50)):
            expected = free * size / sum(_quantile(q, h) for h in hist.values())
            assert expected > 0, page
            checks.append({"expr": f"count(abs({name}{sel} - {expected!r}) < {expected * 1e-9!r})",
                           "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 1}]})
    group = capacity_group(opts, capacity_alerts(opts, "https://runbooks.example.com"))
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}]}
    done = _promtool_test(promtool, {"rules.yaml": rule_file([group], "# test\n"), "test.yaml": yaml.safe_dump(doc)}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_options_reach_the_rules_and_the_generated_tests_follow_them(promtool, tmp_path):
    opts = CapacityOptions(footprint_window=1 * 60 * MINUTE, trend_window=20 * MINUTE, seats_low=10, seats_low_for=5 * MINUTE,
                           exhaustion_minutes=30, exhaustion_for=10 * MINUTE)
    files = capacity_rules(compile_catalog(BuildOptions(inputs=(), capacity=opts, autoscaling=False))).files
    rules = {r.get("alert") or r["record"]: r for g in yaml.safe_load(files[RULES])["groups"] for r in g["rules"]}
    assert list(rules) == [K.FREE_TOKENS, K.FOOTPRINT_P99, K.FOOTPRINT_P50, K.COMMITTED_TOKENS, K.FREE_TOKENS_NET,
                           K.SEATS_P99, K.SEATS_P50, K.POOL_SEATS_P99, K.POOL_SEATS_P50, K.POOL_WAITING,
                           K.POOL_FREE_TOKENS, K.POOL_FREE_TOKENS_NET, K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION,
                           *K.ALERTS]
    assert "[1h]" in rules[K.FOOTPRINT_P99]["expr"] and "[1h]" in rules[K.COMMITTED_TOKENS]["expr"]
    assert "[20m]" in rules[K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION]["expr"]
    assert rules[K.SEATS_LOW]["expr"].startswith(f"{K.POOL_SEATS_P99} < 10") and rules[K.SEATS_LOW]["for"] == "5m"
    assert rules[K.SEATS_EXHAUSTION]["expr"].startswith(f"{K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION} < 30")
    assert rules[K.SEATS_EXHAUSTION]["for"] == "10m" and rules[K.SEATS_EXHAUSTION]["labels"]["severity"] == "critical"
    assert rules[K.SEATS_LOW]["labels"]["severity"] == "warning"
    done = _promtool_test(promtool, {Path(RULES).name: files[RULES], "test.yaml": files[TESTS]}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_bad_options_are_reported_with_the_option_and_the_fix():
    bad = CapacityOptions(seats_low=0, exhaustion_minutes=5, exhaustion_for=5 * MINUTE, trend_window=90_000)
    with pytest.raises(SpecErrors) as err:
        compile_catalog(BuildOptions(inputs=(), capacity=bad, autoscaling=False))
    text = str(err.value)
    for name in ("capacity_seats_low", "capacity_exhaustion_for", "capacity_trend_window"):
        assert f"--{name.replace('_', '-')}" in text, name


def test_a_page_that_would_warn_under_5_minutes_is_refused():
    # A steady fall is forecast under 15 minutes with 14 left; `for` 10m fires with 4 left: under the promised 5.
    bad = CapacityOptions(exhaustion_minutes=15, exhaustion_for=10 * MINUTE)
    assert [name for name, _ in bad.problems()] == ["capacity_exhaustion_for"]
    assert "less than 5 minutes before" in bad.problems()[0][1]
    assert CapacityOptions(exhaustion_minutes=15, exhaustion_for=9 * MINUTE).problems() == []


def test_cli_flags_set_the_options_and_no_capacity_rules_drops_them(tmp_path, monkeypatch):
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    assert main(["build", "slos", "--out", str(tmp_path), "--capacity-seats-low", "6", "--capacity-exhaustion-minutes",
                 "20", "--capacity-trend-window", "15m"]) == 0
    text = (tmp_path / RULES).read_text()
    assert f"{K.POOL_SEATS_P99} < 6" in text and f"{K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION} < 20" in text and "[15m]" in text
    assert main(["build", "slos", "--out", str(tmp_path), "--no-capacity-rules"]) == 0
    assert not (tmp_path / RULES).exists()


def test_default_build_has_the_capacity_files_and_runbooks():
    from slogen.build import build

    artifacts = build(BuildOptions()).files
    assert {RULES, TESTS, f"deploy/generated/prometheusrule-{K.GROUP}.yaml"} <= set(artifacts)
    assert all(f"docs/runbooks/{n}.md" in artifacts for n in K.ALERTS)
    fewer = build(dataclasses.replace(BuildOptions(), capacity=CapacityOptions(enabled=False))).files
    assert set(artifacts) - set(fewer) == {RULES, TESTS, f"deploy/generated/prometheusrule-{K.GROUP}.yaml",
                                           *(f"docs/runbooks/{n}.md" for n in K.ALERTS)}


def test_two_static_targets_of_one_model_on_two_nodes_keep_their_own_seats(promtool, tmp_path):
    """Engines scraped as static targets carry no pod: node is what tells two replicas apart. Seats are recorded
    per engine identity (node included), so each node's seats are its own free tokens over its own footprint,
    not the two summed (and, before node was kept, one series for both: 2x the seats of either)."""
    opts = CapacityOptions()
    ident = {c.LABEL_NAMESPACE: "llm", c.LABEL_MODEL: "m", c.LABEL_ENGINE: "vllm"}
    series, checks = [], []
    for node, free_blocks in (("n1", 100), ("n2", 40)):
        labels = {**ident, c.LABEL_NODE: node}
        series += [{"series": c.KV_BLOCKS_FREE.name + label_filter(labels), "values": f"{free_blocks}x10"},
                   {"series": c.KV_BLOCK_SIZE.name + label_filter(labels), "values": "16x10"}]
        # Every request: 100 prompt tokens (bucket 128) and 28 output tokens (bucket 32); 1 request a minute.
        for metric, edges, at in ((c.REQUEST_PROMPT_TOKENS, (64, 128, 256), 128), (c.REQUEST_GENERATION_TOKENS, (16, 32, 64), 32)):
            for le in (*edges, "+Inf"):
                n = "0+1x10" if le == "+Inf" or le >= at else "0x10"
                series.append({"series": f"{metric.name}_bucket" + label_filter({**labels, c.LABEL_LE: str(le)}),
                               "values": n})
        footprint = _quantile(0.99, {64: 0, 128: 1, 256: 1, math.inf: 1}) + _quantile(0.99, {16: 0, 32: 1, 64: 1, math.inf: 1})
        expected = free_blocks * 16 / footprint
        sel = label_filter({c.LABEL_NODE: node})
        checks.append({"expr": f"count(abs({K.SEATS_P99}{sel} - {expected!r}) < {expected * 1e-9!r})",
                       "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 1}]})
    checks.append({"expr": f"count({K.SEATS_P99})", "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 2}]})
    group = capacity_group(opts, capacity_alerts(opts, "https://runbooks.example.com"))
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}]}
    done = _promtool_test(promtool, {"rules.yaml": rule_file([group], "# test\n"), "test.yaml": yaml.safe_dump(doc)}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
