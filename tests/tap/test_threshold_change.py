"""A threshold changed on a running tap (issue 35): the latency SLI must not count the requests measured
before the change against the new threshold.

The SLI is `count - bucket{le=threshold}` per series (slogen/plugins/llm.py: `measurable`). Had the new
threshold's bucket been born at the reload in a series whose `_count` carries everything before it, every
earlier request would read as slow. So each histogram series carries its edges' hash (`buckets`): a reload
that changes the edges starts a new set of series, count and buckets at 0 together, and the old set leaves
the page. Here through the tap's own page (PageRenderer), the prometheus_client view of the same values,
and the node exporter's adapter, which re-exposes the tap's families.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter import promtext
from exporter.adapters import tap as tap_adapter
from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.exposition import PageRenderer
from exporter.tap.metrics import HISTOGRAMS, TapMetrics, edges_id
from exporter.tap.timing import Timings
from exporter.tap.workers import merge_expositions
from llmslo import conventions as C


def config(ttft: float) -> SloConfig:
    """The incident's service: one class whose TTFT objective the reload moves (0.5 s -> 0.4 s)."""
    return SloConfig((SloClass("interactive", ttft, 0.05, ("chat-*",)),), {"ttft": (ttft,), "tpot": (0.05,)})


OLD, NEW = config(0.5), config(0.4)
FAST = Timings(0.001, 0.2, 0.01, 1.0, 10, C.USAGE_SOURCE_ENGINE)  # every request 0.2 s to its first token


def page(m: TapMetrics, r: PageRenderer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = r.render_now().decode()
    got = {(s.name, frozenset(s.labels.items())): s.value
           for fam in text_string_to_metric_families(text) for s in fam.samples}
    client = {(s.name, frozenset(s.labels.items())): s.value
              for fam in text_string_to_metric_families(generate_latest(m.registry).decode()) for s in fam.samples
              if not s.name.endswith("_created")}
    assert got == client  # the served page and the registry view agree, before and after the change
    return got


def ttft(samples: dict, suffix: str, **labels: str) -> dict[frozenset, float]:
    """TTFT samples of one suffix (`_count`, `_bucket`) whose labels include `labels`."""
    return {ls: v for (n, ls), v in samples.items() if n == C.TAP_TTFT.name + suffix and set(labels.items()) <= ls}


def buckets_values(samples: dict, d: C.MetricDef) -> set[str]:
    return {dict(ls)[C.LABEL_BUCKETS] for (n, ls) in samples if n.startswith(d.name + "_")}


def test_a_threshold_change_starts_a_new_series_set_at_0_and_the_old_one_leaves_the_page() -> None:
    m = TapMetrics(OLD)
    r = PageRenderer(m)
    for _ in range(3):
        m.record("chat-a", "interactive", C.OUTCOME_OK, FAST, True)
    before = page(m, r)
    old_id = edges_id(m.edges["ttft"])
    assert buckets_values(before, C.TAP_TTFT) == {old_id}
    assert ttft(before, "_count", model="chat-a") == {frozenset({("model", "chat-a"), ("slo_class", "interactive"),
                                                                 (C.LABEL_BUCKETS, old_id)}): 3}
    assert not ttft(before, "_bucket", le="0.4")  # the new threshold is no edge of the old configuration
    tpot_id = m.bucket_ids[1]

    assert m.set_slo(NEW) == [C.TAP_TTFT.name, C.TAP_TTFB.name]  # TTFB is read at the TTFT thresholds
    after = page(m, r)
    new_id = edges_id(m.edges["ttft"])
    assert new_id != old_id and buckets_values(after, C.TAP_TTFT) == {new_id}  # the old set is gone
    # The new set: every series the tap had (the request's model, and the class under __other__), at 0,
    # count and every bucket alike, with the new edge, so the first request after the change is an increase.
    counts = ttft(after, "_count")
    assert {dict(ls)[C.LABEL_MODEL] for ls in counts} == {"chat-a", "__other__"} and set(counts.values()) == {0}
    at_new_edge = ttft(after, "_bucket", le="0.4")
    assert len(at_new_edge) == len(counts) and set(at_new_edge.values()) == {0}
    assert set(ttft(after, "_bucket").values()) == {0}
    # What did not change goes on: TPOT's edges (same id, same counts) and every counter.
    assert buckets_values(after, C.TAP_TPOT) == {tpot_id}
    assert sum(v for (n, ls), v in after.items() if n == C.TAP_TPOT.count()) == 3
    assert sum(v for (n, ls), v in after.items() if n == C.TAP_REQUESTS.name) == 3

    m.record("chat-a", "interactive", C.OUTCOME_OK, FAST, True)
    now = page(m, r)
    # Count and the new threshold's bucket come from the same series: the SLI's join pairs them, and a
    # healthy request is good (count - bucket{le="0.4"} = 0), where the old design read 3 of 4 as slow.
    for labels, count in ttft(now, "_count").items():
        assert now[(C.TAP_TTFT.bucket(), labels | {(C.LABEL_LE, "0.4")})] == count
    assert ttft(now, "_count", model="chat-a") == {frozenset({("model", "chat-a"), ("slo_class", "interactive"),
                                                              (C.LABEL_BUCKETS, new_id)}): 1}


def test_a_reload_that_keeps_the_edges_keeps_the_series() -> None:
    m = TapMetrics(OLD)
    m.record("chat-a", "interactive", C.OUTCOME_OK, FAST, True)
    ids = m.bucket_ids
    assert m.set_slo(config(0.5)) == []
    assert m.bucket_ids == ids
    assert ttft(page(m, PageRenderer(m)), "_count", model="chat-a", buckets=ids[0]).popitem()[1] == 1


def test_the_node_exporter_carries_the_buckets_label_so_old_and_new_sets_stay_apart() -> None:
    """The adapter keeps every label a tap family declares: the new series set stays apart from the old
    one (summing them would give the old count a new bucket again), and the old set is gone with the page."""
    m = TapMetrics(OLD)
    r = PageRenderer(m)
    m.record("chat-a", "interactive", C.OUTCOME_OK, FAST, True)
    identity = {"pod": "pod-a", "namespace": "ns", "node": "n1", "model": "pod-model"}
    before = tap_adapter.adapt(promtext.parse_page(r.render_now().decode()).families, identity)
    old_id = m.bucket_ids[0]
    m.set_slo(NEW)
    m.record("chat-a", "interactive", C.OUTCOME_OK, FAST, True)
    after = tap_adapter.adapt(promtext.parse_page(r.render_now().decode()).families, identity)
    for out, want in ((before, old_id), (after, m.bucket_ids[0])):
        hist = [s for s in out if s.metric in {d for d, _ in HISTOGRAMS}]
        assert hist and {s.labels[C.LABEL_BUCKETS] for s in hist if s.metric == C.TAP_TTFT} == {want}
    counts = {s.labels[C.LABEL_MODEL]: s.value for s in after
              if s.metric == C.TAP_TTFT and s.suffix == "_count" and s.labels[C.LABEL_MODEL] == "chat-a"}
    assert counts == {"chat-a": 1}
    at_edge = [s.value for s in after if s.metric == C.TAP_TTFT and s.suffix == "_bucket"
               and s.labels[C.LABEL_MODEL] == "chat-a" and float(s.labels[C.LABEL_LE]) == 0.4]
    assert at_edge == [1]


def test_with_workers_a_dead_workers_series_of_the_old_configuration_leave_the_merged_page() -> None:
    """`--workers`: what a worker that died had counted stays in the sum (exporter.tap.workers), but not its
    histogram series of the configuration before a reload: no live worker shows their `buckets`, so they
    end, as they do in one process; its counters still count."""
    dead, live = TapMetrics(OLD), TapMetrics(OLD)
    for m in (dead, live):
        m.record("chat-a", "interactive", C.OUTCOME_OK, FAST, True)
    retired = PageRenderer(dead).render_now().decode()
    old_id = live.bucket_ids[0]
    live.set_slo(NEW)
    live.record("chat-a", "interactive", C.OUTCOME_OK, FAST, True)
    merged = merge_expositions([retired, PageRenderer(live).render_now().decode()], [None, "0"])
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for fam in text_string_to_metric_families(merged) for s in fam.samples}
    # (the old TTFT edges are E2E's ladder, so its id stays on the page there: the check is per histogram)
    assert buckets_values(samples, C.TAP_TTFT) == {live.bucket_ids[0]}
    assert buckets_values(samples, C.TAP_E2E) == {old_id} == {live.bucket_ids[2]}
    assert ttft(samples, "_count", model="chat-a").popitem()[1] == 1
    assert sum(v for (n, ls), v in samples.items() if n == C.TAP_REQUESTS.name) == 3  # 1 retired + 2 live
    # Before the reload (the same edges on both pages) the dead worker's histogram stays in the sum.
    both = merge_expositions([retired, PageRenderer(dead).render_now().decode()], [None, "0"])
    assert f'{C.LABEL_BUCKETS}="{old_id}"' in both
