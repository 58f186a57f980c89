"""KV seats (alerts/llmslo-capacity.rules.yaml): the recorded seats on every engine kind's page, the options,
the generated promtool tests (a pool filling up pages; a full but stable one does not; load waves do not, unless
on a downward trend), and the issue-35 wave staged against the page."""

from __future__ import annotations

import dataclasses
import math
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from exporter import adapters
from exporter.promtext import parse_page
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
        samples = adapter.adapt(parse_page((SHARED_PAGES / page).read_text(), adapter.wanted).families, ident)
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
                           exhaustion_minutes=30, exhaustion_for=10 * MINUTE, wave_period=90 * MINUTE)
    files = capacity_rules(compile_catalog(BuildOptions(inputs=(), capacity=opts, autoscaling=False))).files
    rules = {r.get("alert") or r["record"]: r for g in yaml.safe_load(files[RULES])["groups"] for r in g["rules"]}
    assert list(rules) == [K.FREE_TOKENS, K.FOOTPRINT_P99, K.FOOTPRINT_P50, K.COMMITTED_TOKENS, K.FREE_TOKENS_NET,
                           K.SEATS_P99, K.SEATS_P50, K.POOL_SEATS_P99, K.POOL_SEATS_P50, K.POOL_WAITING,
                           K.POOL_FREE_TOKENS, K.POOL_FREE_TOKENS_NET, K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION,
                           *K.ALERTS]
    assert "[1h]" in rules[K.FOOTPRINT_P99]["expr"] and "[1h]" in rules[K.COMMITTED_TOKENS]["expr"]
    assert "[20m]" in rules[K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION]["expr"]
    assert "[1h30m] offset 20m" in rules[K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION]["expr"]
    names = [t["name"] for t in yaml.safe_load(files[TESTS])["tests"]]
    assert [n.split(":")[0] for n in names[-3:]] == ["load waves every 90m (a batch job)", "steady fill for 140m (longer than "
                                                     "the wave period)", "load waves on a downward trend"]
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


def test_a_wave_period_too_short_to_hold_a_paging_wave_is_refused():
    # A wave the 10m forecast pages on (`for` 5m) falls for 16m, and its last bottom must lie a trend window back.
    short = CapacityOptions(wave_period=25 * MINUTE)
    assert [name for name, _ in short.problems()] == ["capacity_wave_period"]
    assert "(26m)" in short.problems()[0][1] and "e.g. 1h" in short.problems()[0][1]
    assert CapacityOptions(wave_period=26 * MINUTE).problems() == []
    assert [n for n, _ in CapacityOptions(wave_period=90_000).problems()] == ["capacity_wave_period"]


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


def _wave_pool_series(minutes: int) -> list[dict]:
    """Issue 35's pool: two vLLM replicas, 25 p99 seats free on each between waves; every hour from minute 42 a
    batch wave takes them down steadily for 15 minutes to the hour's bottom (8, 7, then 7.5 seats a replica: the
    pool's 16, 14, 15; the bottoms differ by a seat), then leaves in 3 minutes. 99 of 100 requests are within
    1024 prompt and 1024 output tokens: a p99 seat is 2048 tokens, 128 blocks of 16."""
    top, bottoms = 25, (8, 7, 7.5)
    seats = []
    for m in range(minutes + 1):
        hour, at = divmod(m, 60)
        bottom, into = bottoms[min(hour, len(bottoms) - 1)], at - 42  # minutes into this hour's wave
        fall, rise = top - (top - bottom) * into / 15, bottom + (top - bottom) * (into - 15) / 3
        seats.append(top if into < 0 else fall if into <= 15 else rise)
    series = []
    for pod in ("vllm-0", "vllm-1"):
        labels = {c.LABEL_ENGINE: "vllm", c.LABEL_MODEL: "m", c.LABEL_NAMESPACE: "batch", c.LABEL_POD: pod,
                  c.LABEL_NODE: "n", c.LABEL_CLUSTER: "east"}
        series += [{"series": c.KV_BLOCKS_FREE.name + label_filter(labels), "values": " ".join(f"{s * 128:g}" for s in seats)},
                   {"series": c.KV_BLOCK_SIZE.name + label_filter(labels), "values": f"16x{minutes}"},
                   {"series": c.REQUESTS_WAITING.name + label_filter(labels), "values": f"0x{minutes}"}]
        for metric, edges in ((c.REQUEST_PROMPT_TOKENS, ("1024", "2048", "+Inf")), (c.REQUEST_GENERATION_TOKENS, ("1024", "+Inf"))):
            for le in edges:
                series.append({"series": f"{metric.name}_bucket" + label_filter({**labels, c.LABEL_LE: le}),
                               "values": f"0+{99 if le == '1024' else 100}x{minutes}"})
    return series


def test_hourly_batch_waves_with_seats_left_do_not_page_though_the_10m_trend_reads_them_as_exhaustion(promtool, tmp_path):
    """Issue 35's attack, staged by hand rather than by the generator: at each wave's bottom the 10m trend alone
    forecasts exhaustion within 15 minutes for 7+ minutes running (the old page fired for 3 minutes every hour),
    while 14-16 p99 seats are free; after the first hour (the first wave has no earlier bottom to compare with,
    and pages as before) the page stays silent: no wave stays under the last one's bottom for long."""
    opts = CapacityOptions()
    minutes = 3 * 60 + 10
    pool = {c.LABEL_CLUSTER: "east", c.LABEL_MODEL: "m", c.LABEL_NAMESPACE: "batch"}
    net = K.POOL_FREE_TOKENS_NET + label_filter(pool)
    short_trend_alone = f"clamp_min({net}, 0) / (deriv({net}[10m]) * -60 > 0) < 15"
    checks = []
    for hour in (1, 2):
        bottom = 60 * hour + 57
        for m in range(bottom - 6, bottom + 1):  # the attack: the forecast without the wave test is under 15 minutes
            checks.append({"expr": f"count({short_trend_alone})", "eval_time": f"{m}m", "exp_samples": [{"labels": "{}", "value": 1}]})
        seats = f"abs({K.POOL_SEATS_P99}{label_filter(pool)} - {({1: 14, 2: 15}[hour])}) < 1e-6"  # the pool's seats at the bottom
        checks.append({"expr": f"count({seats})", "eval_time": f"{bottom}m", "exp_samples": [{"labels": "{}", "value": 1}]})
    # the first wave (no bottom before it) still pages: a pool's first wave period is as before
    checks.append({"expr": f"count({K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION}{label_filter(pool)} < 15)", "eval_time": "57m",
                   "exp_samples": [{"labels": "{}", "value": 1}]})
    alerts = [{"eval_time": f"{m}m", "alertname": K.SEATS_EXHAUSTION, "exp_alerts": []} for m in range(61, minutes + 1)]
    group = capacity_group(opts, capacity_alerts(opts, "https://runbooks.example.com"))
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": _wave_pool_series(minutes), "promql_expr_test": checks,
                      "alert_rule_test": alerts}]}
    done = _promtool_test(promtool, {"rules.yaml": rule_file([group], "# test\n"), "test.yaml": yaml.safe_dump(doc)}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
