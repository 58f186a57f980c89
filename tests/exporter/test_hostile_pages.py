"""Hostile engine pages (issue #14, item 3): NaN and Inf values, series served twice, a flood of series.

None of them may take a target down, starve its other families or reach an adapter: each is left out
where it enters (the parser, `promtext.parse_page`), per value, and counted in
`llm_exporter_samples_dropped_total{target,reason}`.
"""

from __future__ import annotations

import math
import re
import threading
from pathlib import Path

import pytest

from exporter import adapters, promtext
from exporter import cycle as cycle_module
from exporter.adapters import Adapter
from exporter.config import Limits, TargetConfig
from exporter.exposition import render
from exporter.guard import (
    DUPLICATE_SAMPLE,
    FAMILY_LIMIT,
    NONFINITE,
    SERIES_LIMIT,
    limit_series,
)
from exporter.model import NormSample
from llmslo import conventions as c
from tests.exporter.test_runtime import collect, promtool_problems, self_metric

VALUE_RE = re.compile(r"^(?P<head>[a-zA-Z_:][^ ]*(?:\{.*\})?) (?P<value>\S+)$")


def dropped(snap, target: str, reason: str) -> float:
    return self_metric(snap, c.EXPORTER_SAMPLES_DROPPED, target=target, reason=reason)


def engine_series(snap) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in snap.samples if s.metric in c.ENGINE_METRICS}


def write(tmp_path: Path, name: str, text: str) -> TargetConfig:
    page = tmp_path / name
    page.write_text(text)
    return TargetConfig(kind="vllm", url=page.as_uri(), name="t")


def value_lines(text: str, wanted: frozenset[str]) -> list[int]:
    """Indexes of the sample lines of `text` whose family the adapter reads."""
    out = []
    for i, line in enumerate(text.splitlines()):
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if any(name == w or name.startswith(w + "_") for w in wanted):
            out.append(i)
    return out


def with_values(text: str, indexes: list[int], value: str) -> str:
    lines = text.splitlines()
    for i in indexes:
        m = VALUE_RE.match(lines[i])
        assert m, lines[i]
        lines[i] = f"{m['head']} {value}"
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# The parser: checked parse, per value
# --------------------------------------------------------------------------------------
PAGE = """\
# TYPE g gauge
g{a="1"} NaN
g{a="2"} 0.5
g{a="3"} +Inf
# TYPE k_total counter
k_total -Inf
k_total{a="x"} 3
# TYPE h histogram
h_bucket{le="1"} 1
h_bucket{le="+Inf"} NaN
h_sum NaN
h_count 2
# TYPE s summary
s{quantile="0.5"} NaN
s{quantile="0.9"} +Inf
s_sum 0
s_count 0
"""


def test_checked_parse_leaves_out_each_nonfinite_value_and_counts_it():
    page = promtext.parse_page(PAGE, checked=True)
    got = {(s.name, tuple(s.labels.items())): s.value for f in page.families.values() for s in f.samples}
    assert got == {
        ("g", (("a", "2"),)): 0.5,
        ("k_total", (("a", "x"),)): 3.0,
        ("h_bucket", (("le", "1"),)): 1.0,
        ("h_count", ()): 2.0,
        ("s_sum", ()): 0.0,
        ("s_count", ()): 0.0,
    }
    # g NaN, g +Inf, k -Inf, the +Inf bucket and the NaN sum; a summary's quantiles are legitimately NaN
    # (no observations): left out, not counted.
    assert (page.nonfinite, page.duplicates, page.over_limit, page.errors) == (5, 0, 0, 0)


def test_unchecked_parse_keeps_nonfinite_values_as_prometheus_client_does():
    families = promtext.parse_page(PAGE).families
    assert math.isnan(families["g"].samples[0].value)
    assert families["k"].samples[0].value == -math.inf
    assert len(families["s"].samples) == 4


@pytest.mark.parametrize("spelling", ["NaN", "nan", "+Inf", "-Inf", "inf", "Infinity", "NaN 1700000000000"])
def test_every_nonfinite_spelling_and_every_line_shape(spelling):
    text = (
        "# TYPE g gauge\n"
        f"g {spelling}\n"  # no labels
        f'g{{a="1"}} {spelling}\n'  # strict labels (fast path)
        f'g{{ a = "2" }} {spelling}\n'  # lenient labels (exact path)
        f'g_untyped{{a="1"}} {spelling}\n'  # a family of its own
        'g{a="3"} 1\n'
    )
    page = promtext.parse_page(text, checked=True)
    assert page.nonfinite == 4, page
    assert [s.value for f in page.families.values() for s in f.samples] == [1.0]


def test_a_page_served_twice_keeps_the_first_value_and_counts_the_repeats():
    once = 'k_total{a="1"} 5\n# TYPE k_total counter\nk_total{a="1"} 7\nk_total 2\n# TYPE g gauge\ng{ a = "x" } 1\n'
    page = promtext.parse_page(once + once, checked=True)
    # The untyped line before the TYPE is a family of its own, but the same series as the typed line after it:
    # the typed one is the repeat.
    assert [s.value for s in page.families["k_total"].samples] == [5.0]
    assert [(s.labels, s.value) for s in page.families["k"].samples] == [({}, 2.0)]
    assert [s.value for s in page.families["g"].samples] == [1.0]
    assert page.duplicates == 1 + 4  # that one, then the whole second copy
    assert promtext.parse_page(once, checked=True).duplicates == 1
    assert len(promtext.parse_page(once + once).families["k"].samples) == 4  # unchecked: prometheus_client's answer


def test_family_limit_reads_no_line_past_it():
    lines = [f'g{{id="{i}"}} {i}' for i in range(10)]
    broken = ['g{id="x"} not-a-number', 'g{id=unquoted} 1', "g{"]  # errors, if they were read
    text = "# TYPE g gauge\n" + "\n".join(lines[:5] + broken + lines[5:]) + "\n# TYPE h gauge\nh 1\n"
    page = promtext.parse_page(text, family_limit=5)
    assert [s.value for s in page.families["g"].samples] == [0, 1, 2, 3, 4]
    assert page.families["h"].samples[0].value == 1  # the next family has its own budget
    assert (page.over_limit, page.errors) == (8, 0)
    assert promtext.parse_page(text).errors == 3


def test_family_limit_holds_across_repeated_runs_and_spellings():
    # One counter spelled two ways (`# TYPE k_total counter` + k_total, `# TYPE k counter` + k), 20 runs each,
    # and k_total lines after `# TYPE k counter`: untyped, a family of their own (as in prometheus_client).
    runs = "".join(f'# TYPE k_total counter\nk_total{{i="{i}"}} 1\n# TYPE k counter\nk{{j="{i}"}} 1\n'
                   f'k_total{{u="{i}"}} 1\n' for i in range(20))
    page = promtext.parse_page(runs, family_limit=3)
    assert [s.labels for s in page.families["k"].samples] == [{"i": "0"}, {"j": "0"}, {"i": "1"}]
    assert [s.labels for s in page.families["k_total"].samples] == [{"u": "0"}, {"u": "1"}, {"u": "2"}]
    assert page.over_limit == 60 - 6


def test_checks_cost_nothing_on_a_clean_page(sample_pages):
    for path, kind in sample_pages.items():
        text = path.read_text()
        want = adapters.get(kind).wanted
        plain = promtext.parse_page(text, want)
        checked = promtext.parse_page(text, want, checked=True, family_limit=Limits().max_samples_per_family)
        assert (checked.nonfinite, checked.duplicates, checked.over_limit) == (0, 0, 0), path.name
        assert {k: [(s.name, s.labels, s.value) for s in f.samples] for k, f in checked.families.items()} == \
            {k: [(s.name, s.labels, s.value) for s in f.samples] for k, f in plain.families.items()}, path.name


# --------------------------------------------------------------------------------------
# Through the collector: the target stays up, the rest of its page is adapted
# --------------------------------------------------------------------------------------
def test_vllm_kv_cache_usage_nan_does_not_take_the_target_down(tmp_path, pages_dir):
    text = (pages_dir / "vllm-v1.prom").read_text()
    [clean] = collect([write(tmp_path, "clean.prom", text)])
    usage = [i for i in value_lines(text, frozenset({c.VLLM.KV_CACHE_USAGE_PERC}))]
    assert usage
    [snap] = collect([write(tmp_path, "nan.prom", with_values(text, usage, "NaN"))])
    assert snap.targets[0].up, snap.targets[0].reason
    assert dropped(snap, "t", NONFINITE) == len(usage)
    got, want = engine_series(snap), engine_series(clean)
    missing = {key[0] for key in set(want) - set(got)}
    assert missing == {c.KV_CACHE_USAGE.name, c.KV_BLOCKS_FREE.name}  # only what is computed from the NaN
    assert all(got[k] == want[k] for k in got)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_every_value_nonfinite_on_every_engine_page(tmp_path, sample_pages, value):
    for path, kind in sample_pages.items():
        text = path.read_text()
        lines = value_lines(text, adapters.get(kind).wanted)
        target = TargetConfig(kind=kind, url=write(tmp_path, path.name, with_values(text, lines, value)).url, name="t")
        [snap] = collect([target])
        assert snap.targets[0].reason != "adapter_error", path.name
        assert dropped(snap, "t", NONFINITE) > 0, path.name
        assert all(math.isfinite(s.value) for s in snap.samples if s.metric in c.ENGINE_METRICS), path.name
        assert promtool_problems(render(snap.samples)) == [], path.name


def test_an_adapter_computing_a_nonfinite_value_loses_that_value_only(tmp_path, monkeypatch, pages_dir):
    real = adapters.get("vllm")

    def overflowing(families, identity):
        out = real.adapt(families, identity)
        return out + [NormSample(c.REQUESTS_WAITING, {**out[0].labels, c.LABEL_MODEL: "overflow"}, 1e308 * 10)]

    monkeypatch.setitem(adapters.ADAPTERS, "vllm", Adapter("vllm", real.wanted, overflowing))
    [snap] = collect([write(tmp_path, "v.prom", (pages_dir / "vllm-v1.prom").read_text())])
    assert snap.targets[0].up
    assert dropped(snap, "t", NONFINITE) == 1
    assert not [s for s in snap.samples if s.labels.get(c.LABEL_MODEL) == "overflow"]


def test_a_page_served_twice_does_not_double_its_counters(tmp_path, pages_dir):
    text = (pages_dir / "vllm-v1.prom").read_text()
    [once] = collect([write(tmp_path, "once.prom", text)])
    [twice] = collect([write(tmp_path, "twice.prom", text + text)])
    assert engine_series(twice) == engine_series(once)
    read = promtext.parse_page(text, adapters.get("vllm").wanted, checked=True).families.values()
    assert dropped(twice, "t", DUPLICATE_SAMPLE) == sum(len(f.samples) for f in read) > 100
    assert dropped(once, "t", DUPLICATE_SAMPLE) == 0


def flooded(text: str, junk: int) -> str:
    """The page with `junk` series of a made-up model in `vllm:num_requests_running`, right after its TYPE."""
    flood = "".join(f'vllm:num_requests_running{{model_name="junk-{i:06d}"}} 1\n' for i in range(junk))
    marker = f"# TYPE {c.VLLM.NUM_REQUESTS_RUNNING} gauge\n"
    assert marker in text
    return text.replace(marker, marker + flood, 1)


def test_a_flooded_family_keeps_the_targets_other_families(tmp_path, pages_dir):
    text = (pages_dir / "vllm-v1.prom").read_text()
    limits = Limits(max_series_per_target=600, max_samples_per_family=500)
    [clean] = collect([write(tmp_path, "clean.prom", text)], limits=limits)
    [snap] = collect([write(tmp_path, "flood.prom", flooded(text, 20_000))], limits=limits)
    assert snap.targets[0].up
    # Every normalized family of the clean page is still there. (The page's own running-requests series came
    # after the junk, past the family's limit, so that family now holds junk only, and the vLLM adapter, which
    # takes the page's model name from that family, names the junk model on the LoRA series.)
    families = {s.metric.name for s in snap.samples if s.metric in c.ENGINE_METRICS}
    assert families == {s.metric.name for s in clean.samples if s.metric in c.ENGINE_METRICS}
    assert {k[0] for k in engine_series(snap) if dict(k[1])[c.LABEL_MODEL] == "junk-000000"} >= {c.REQUESTS_RUNNING.name}
    assert dropped(snap, "t", FAMILY_LIMIT) == 20_000 + 1 - 500
    assert self_metric(snap, c.EXPORTER_SERIES_DROPPED, target="t", reason=SERIES_LIMIT) == 500 + len(
        engine_series(clean)) - 1 - 600
    assert snap.targets[0].series == 600


def test_junk_past_the_family_limit_is_never_parsed(tmp_path, pages_dir, monkeypatch):
    parsed_labels = []
    real_new_labels = promtext._new_labels

    def counting(text):
        parsed_labels.append(text)
        return real_new_labels(text)

    promtext.clear_label_cache()
    monkeypatch.setattr(promtext, "_new_labels", counting)
    text = flooded((pages_dir / "vllm-v1.prom").read_text(), 5_000)
    collect([write(tmp_path, "flood.prom", text)], limits=Limits(max_samples_per_family=100))
    assert sum(1 for t in parsed_labels if "junk-" in t) == 100


def test_the_guard_keeps_every_familys_first_series_before_any_second():
    def labels(model):
        return {"engine": "vllm", "model": model, "pod": "", "namespace": "", "node": "n"}

    flood = [NormSample(c.REQUESTS_RUNNING, labels(f"junk-{i}"), 1) for i in range(100)]
    real = [NormSample(m, labels("real"), 1) for m in (c.REQUESTS_WAITING, c.KV_CACHE_USAGE, c.PREEMPTIONS)]
    hist = [NormSample(c.TTFT, {**labels("real"), "le": le}, 1, "_bucket") for le in ("0.1", "+Inf")]
    hist += [NormSample(c.TTFT, labels("real"), 1, "_count")]
    kept, drops = limit_series(flood + real + hist, Limits(max_series_per_target=10))
    kept_ids = {id(k) for k in kept}
    assert all(id(r) in kept_ids for r in real)
    assert all(id(h) in kept_ids for h in hist)  # a whole histogram, on its family's first turn
    assert sum(1 for k in kept if k.metric is c.REQUESTS_RUNNING) == 10 - 3 - 3
    assert drops == {SERIES_LIMIT: 100 - 4}


def test_parsing_adapting_and_capping_run_off_the_event_loop(tmp_path, pages_dir, monkeypatch):
    threads = []
    real_limit = cycle_module.limit_series

    def recording(samples, limits):
        threads.append(threading.current_thread())
        return real_limit(samples, limits)

    monkeypatch.setattr(cycle_module, "limit_series", recording)
    collect([write(tmp_path, "v.prom", (pages_dir / "vllm-v1.prom").read_text())])
    assert threads and threading.main_thread() not in threads
