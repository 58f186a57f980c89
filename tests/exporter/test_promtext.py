"""The fast exposition parser against prometheus_client's parser, on the engine pages and on generated pages."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.model import MetricFamily, Sample
from exporter.promtext import clear_label_cache, parse_page
from tests.helpers.needs import shared_dir

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
PAGES_DIR = SHARED / "peers" / "engine-metrics"
PAGE_NAMES = sorted(p.name for p in PAGES_DIR.glob("*.prom")) if PAGES_DIR.is_dir() else ["(no ../shared)"]


# --------------------------------------------------------------------------------------------------------
# Comparison helpers
# --------------------------------------------------------------------------------------------------------
def _value_key(value: float) -> object:
    """NaN never equals itself; compare it as a marker instead."""
    return "NaN" if math.isnan(value) else float(value)


def reference(text: str, want=None) -> dict:
    """prometheus_client's families in our shape: repeated family names merged (first keeps type and help)."""
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        samples = [(s.name, dict(s.labels), _value_key(s.value), s.timestamp) for s in fam.samples]
        if fam.name in out:
            out[fam.name][2].extend(samples)
        else:
            out[fam.name] = (fam.type, fam.documentation, samples)
    if want is not None:
        out = {name: fam for name, fam in out.items() if name in want}
    return out


def ours(families: dict[str, MetricFamily]) -> dict:
    out = {}
    for name, fam in families.items():
        assert isinstance(fam, MetricFamily) and fam.name == name
        assert all(isinstance(s, Sample) for s in fam.samples)
        out[name] = (fam.type, fam.help, [(s.name, s.labels, _value_key(s.value), s.timestamp) for s in fam.samples])
    return out


def assert_same(text: str, want=None) -> None:
    page = parse_page(text, want)
    families, errors = page.families, page.errors
    assert errors == 0
    assert ours(families) == reference(text, want)


# --------------------------------------------------------------------------------------------------------
# The engine sample pages
# --------------------------------------------------------------------------------------------------------
def _page(name: str) -> str:
    shared_dir(PAGES_DIR, "engine sample pages")
    return (PAGES_DIR / name).read_text()


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_engine_page_matches_prometheus_client(page: str) -> None:
    text = _page(page)
    clear_label_cache()
    assert_same(text)
    assert_same(text)  # again, now with the label cache warm


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_engine_page_want_keeps_exactly_the_wanted_families(page: str) -> None:
    text = _page(page)
    names = sorted(reference(text))
    rng = random.Random(page)
    want = set(rng.sample(names, len(names) // 3)) | {"not_on_this_page"}
    assert_same(text, want)
    assert set(parse_page(text, want).families) == want - {"not_on_this_page"}
    assert parse_page(text, []).families == {}


def test_engine_pages_with_adapter_want() -> None:
    """The adapters' own union of families: what an `auto` target parses with."""
    from exporter import adapters

    for page in PAGE_NAMES:
        assert_same(_page(page), adapters.WANT_ALL)


# --------------------------------------------------------------------------------------------------------
# Exact semantics, spelled out
# --------------------------------------------------------------------------------------------------------
def test_counter_naming_follows_prometheus_client() -> None:
    text = (
        "# HELP req_total Requests.\n# TYPE req_total counter\nreq_total{code=\"200\"} 3\n"
        "# HELP req_created Created.\n# TYPE req_created gauge\nreq_created{code=\"200\"} 1.7e9\n"
        "# TYPE tgi_request_count counter\ntgi_request_count 242\n"
    )
    fams = parse_page(text).families
    assert list(fams) == ["req", "req_created", "tgi_request_count"]
    assert fams["req"].type == "counter" and fams["req"].samples[0].name == "req_total"
    assert fams["req_created"].type == "gauge"
    # A counter without `_total` keeps its family name; its samples get the suffix, as prometheus_client does.
    assert fams["tgi_request_count"].samples == [Sample("tgi_request_count_total", {}, 242.0)]
    assert set(parse_page(text, {"req"}).families) == {"req"}


def test_histogram_and_summary_group_their_series() -> None:
    text = (
        "# TYPE lat histogram\n"
        'lat_bucket{le="0.1"} 1\nlat_bucket{le="+Inf"} 2\nlat_sum 0.3\nlat_count 2\nlat_created 1.7e9\n'
        "# TYPE q summary\n"
        'q{quantile="0.5"} 0.2\nq_sum 1\nq_count 4\n'
    )
    fams = parse_page(text).families
    assert [s.name for s in fams["lat"].samples] == ["lat_bucket", "lat_bucket", "lat_sum", "lat_count"]
    assert fams["lat"].samples[1].labels == {"le": "+Inf"}
    assert fams["lat_created"].type == "unknown"  # not part of the histogram family, as in prometheus_client
    assert [s.name for s in fams["q"].samples] == ["q", "q_sum", "q_count"]
    assert_same(text)


def test_values_timestamps_and_escapes() -> None:
    text = (
        "# HELP g A \\\\ backslash,\\na newline and \\t kept.\n"
        "# TYPE g gauge\n"
        'g{v="a\\\\b\\"c\\nd",w="x,y=z}{",e=""} NaN\n'
        "g{v=\"inf\"} +Inf 1700000000123\n"
        'g{v="-inf"} -Inf -5\n'
        'g{v="exp"} 1.5e-3\n'
    )
    fams = parse_page(text).families
    g = fams["g"]
    assert g.help == "A \\ backslash,\na newline and \\t kept."
    assert g.samples[0].labels == {"v": 'a\\b"c\nd', "w": "x,y=z}{", "e": ""}
    assert math.isnan(g.samples[0].value) and g.samples[0].timestamp is None
    assert g.samples[1].value == math.inf and g.samples[1].timestamp == 1700000000.123  # ms -> s
    assert g.samples[2].value == -math.inf and g.samples[2].timestamp == -0.005
    assert g.samples[3].value == 0.0015
    assert_same(text)


def test_untyped_samples_become_unknown_families_and_merge() -> None:
    text = 'a{x="1"} 1\nb 2\na{x="2"} 3\n# TYPE c untyped\nc 4\n'
    fams = parse_page(text).families
    assert fams["a"].type == "unknown" and [s.value for s in fams["a"].samples] == [1.0, 3.0]
    assert fams["c"].type == "unknown"
    assert_same(text)


def test_extra_whitespace_and_lenient_label_spelling() -> None:
    text = (
        "  #   HELP   m   Some   help  \r\n"
        "#\tTYPE m gauge\n"
        '  m{ a = "1" , b="2", }   7   \n'
        'm{a="3",}\t8\n'
        'm{,a="4"}   9    1000\n'
        '{"m", a="5"} 10\n'
        '{__name__="m",a="6"} 11\n'
        "# EOF\n"
    )
    fams = parse_page(text).families
    assert fams["m"].help == "Some   help"
    assert [s.labels for s in fams["m"].samples] == [
        {"a": "1", "b": "2"}, {"a": "3"}, {"a": "4"}, {"a": "5"}, {"a": "6"},
    ]
    assert fams["m"].samples[2].timestamp == 1.0
    assert_same(text)


def test_quoted_utf8_metric_names() -> None:
    text = '# HELP "my.metric" Dots.\n# TYPE "my.metric" gauge\n{"my.metric", a="1"} 2\n'
    assert parse_page(text).families["my.metric"].samples == [Sample("my.metric", {"a": "1"}, 2.0)]
    assert_same(text)


def test_exemplars_are_tolerated_and_ignored() -> None:
    text = (
        "# TYPE rq_total counter\n"
        'rq_total{code="200"} 5 # {trace_id="abc def"} 1.0 1700000000.5\n'
        "rq_total 6 1700000000000 # {trace_id=\"x\"} 2.0\n"
        "# TYPE lat histogram\n"
        'lat_bucket{le="1"} 3 # {trace_id="y"} 0.4\n'
        "# EOF\n"
    )
    fams = parse_page(text).families
    assert [(s.value, s.timestamp) for s in fams["rq"].samples] == [(5.0, None), (6.0, 1700000000.0)]
    assert fams["lat"].samples == [Sample("lat_bucket", {"le": "1"}, 3.0)]


def test_samples_do_not_share_label_dicts() -> None:
    """Label strings are cached across lines and pages; callers must still own what they get."""
    text = '# TYPE g gauge\ng{a="1"} 1\ng{a="1"} 2\n'
    first = parse_page(text).families["g"].samples
    assert first[0].labels is not first[1].labels
    first[0].labels["a"] = "changed"
    first[1].labels.pop("a")
    assert [s.labels for s in parse_page(text).families["g"].samples] == [{"a": "1"}, {"a": "1"}]


def test_want_accepts_any_collection_and_matches_counter_family_names() -> None:
    text = "# TYPE x_total counter\nx_total 1\n# TYPE y gauge\ny 2\nz 3\n"
    assert set(parse_page(text, ["x", "z"]).families) == {"x", "z"}
    assert set(parse_page(text, ("x_total",)).families) == set()  # the family is `x`, as prometheus_client names it
    assert set(parse_page(text, frozenset({"y"})).families) == {"y"}


# --------------------------------------------------------------------------------------------------------
# Generated pages: the tricky parts of the format, at random, compared with prometheus_client
# --------------------------------------------------------------------------------------------------------
VALUE_PIECES = [
    "", "a", "x y", "a,b", "k=v", "a}b", "{", "}", '"', '"quoted"', "\\", "back\\slash", "new\nline", "tab\there",
    "ünïcödé", "日本語", "🚀", " # ", "#", "le", "\\n", '\\"', '=",', "\r", "\u2028", "/v1/chat", "0.5",
]
LABEL_NAMES = ["a", "b_c", "model_name", "engine", "x:y", "_under", "Z9"]
VALUES = [
    "0", "1", "-1", "3.14", "1e-09", "1.5E+10", "NaN", "nan", "+Inf", "-Inf", "Inf", "1.7672256e+09", "0.0", "-0",
    "123456789", "18446744073709551615", ".5",
]
HELP_PIECES = [
    "plain", "back\\slash", "line\nbreak", 'quote " inside', "brace { } =", "日本", "\\t stays", "  spaced  ",
]
TYPES = ["counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset"]


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_value(rng: random.Random) -> str:
    return "".join(rng.choice(VALUE_PIECES) for _ in range(rng.randint(0, 3)))


def _labels(rng: random.Random, extra: dict[str, str] | None = None) -> str:
    names = rng.sample(LABEL_NAMES, rng.randint(0, 3))
    pairs = [(n, _label_value(rng)) for n in names] + list((extra or {}).items())
    rng.shuffle(pairs)
    if not pairs:
        return rng.choice(["", "{}"])
    body = ",".join(f'{n}="{_escape_label(v)}"' for n, v in pairs)
    if rng.random() < 0.1:
        body += ","
    if rng.random() < 0.1:
        body = " " + body.replace(",", " , ") + " "
    return "{" + body + "}"


def _value_tail(rng: random.Random) -> str:
    sep = rng.choice([" ", " ", " ", "  ", "\t"])
    tail = sep + rng.choice(VALUES)
    if rng.random() < 0.15:
        tail += sep + str(rng.choice([1700000000123, 0, -5, 1767225600000]))
    return tail


def generate_page(seed: int, families: int = 40) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(families):
        typ = rng.choice(TYPES)
        base = rng.choice(["fam", "vllm:fam", "tgi_fam", "x"]) + f"{i}_" + rng.choice(["seconds", "tokens", "requests"])
        name = base + "_total" if typ == "counter" and rng.random() < 0.6 else base
        if rng.random() < 0.7:
            doc = "".join(rng.choice(HELP_PIECES) for _ in range(rng.randint(0, 3)))
            lines.append(f"# HELP {name} {_escape_help(doc)}".rstrip())
        if rng.random() < 0.85:
            lines.append(f"# TYPE {name} {typ}")
        for _ in range(rng.randint(0, 3)):
            if typ == "histogram":
                for le in ("0.1", "1.0", "+Inf"):
                    lines.append(f"{name}_bucket{_labels(rng, {'le': le})}{_value_tail(rng)}")
                lines.append(f"{name}_sum{_labels(rng)}{_value_tail(rng)}")
                lines.append(f"{name}_count{_labels(rng)}{_value_tail(rng)}")
            elif typ == "summary":
                for q in ("0.5", "0.99"):
                    lines.append(f"{name}{_labels(rng, {'quantile': q})}{_value_tail(rng)}")
                lines.append(f"{name}_sum{_labels(rng)}{_value_tail(rng)}")
                lines.append(f"{name}_count{_labels(rng)}{_value_tail(rng)}")
            else:
                lines.append(f"{name}{_labels(rng)}{_value_tail(rng)}")
        if typ in ("counter", "histogram") and rng.random() < 0.3:
            lines.append(f"{base.removesuffix('_total')}_created{_labels(rng)} 1.7672256e+09")
        roll = rng.random()
        if roll < 0.05:
            lines.append(f'{{"dotted.{i}", a="1"}} 1')  # a quoted name outside any family
        elif roll < 0.1:
            lines.append(f'{{__name__="named_{i}"}} 2')
        elif roll < 0.15:
            lines.append(rng.choice(["", "# just a comment", "#", "# EOF"]))
        elif roll < 0.2:
            lines.append(f"loose_{i % 3}{_labels(rng)}{_value_tail(rng)}")  # untyped, repeated names merge
    lines = [(" " * rng.randint(0, 2)) + line if rng.random() < 0.1 else line for line in lines]
    newline = "\r\n" if seed % 5 == 0 else "\n"
    return newline.join(lines) + newline


@pytest.mark.parametrize("seed", range(60))
def test_generated_page_matches_prometheus_client(seed: int) -> None:
    text = generate_page(seed)
    expected = reference(text)  # also proves the generated page is valid for prometheus_client
    page = parse_page(text)
    families, errors = page.families, page.errors
    assert errors == 0
    assert ours(families) == expected


@pytest.mark.parametrize("seed", range(20))
def test_generated_page_want_filter(seed: int) -> None:
    text = generate_page(seed)
    rng = random.Random(seed)
    names = sorted(reference(text))
    want = set(rng.sample(names, len(names) // 4))
    assert_same(text, want)


def test_exemplars_on_generated_pages() -> None:
    """Appending an exemplar to every sample changes nothing we return (prometheus_client misreads them)."""
    for seed in range(10):
        text = generate_page(seed)
        exemplar = ' # {trace_id="t 1"} 0.5 1700000000.1'
        with_exemplars = "\n".join(
            line.rstrip("\r") + exemplar + "\r" * line.endswith("\r")
            if line.strip() and not line.lstrip().startswith("#") else line
            for line in text.split("\n")
        )
        assert ours(parse_page(with_exemplars).families) == reference(text)


def test_generator_exercises_the_tricky_parts() -> None:
    """Guard against a generator that quietly stops producing what the tests above rely on."""
    text = "".join(generate_page(seed) for seed in range(60))
    for needle in ('\\"', "\\\\", "\\n", "NaN", "+Inf", "-Inf", "1700000000123", "\t", "\r\n", "# HELP", "_bucket",
                   'quantile="', "_created", "🚀", "}b", ",}", "{ ", '{"dotted', "__name__"):
        assert needle in text, needle


def test_large_page() -> None:
    text = generate_page(7, families=5000)
    assert len(text.encode()) > 1_000_000
    assert_same(text)


# --------------------------------------------------------------------------------------------------------
# Bad input: skipped, counted, never raised
# --------------------------------------------------------------------------------------------------------
BAD_LINES = [
    'g{a="1" 1',  # unclosed labels
    "g{a=1} 1",  # unquoted value
    'g{a="1"} 1_000',  # underscore in value
    "g abc",  # not a number
    'g{a="1",a="2"} 1',  # duplicate label
    'g{le="1",le="2"} 1',  # duplicate label around the bucket shortcut
    'g{a="0",le="1",b="2",le="3"} 1',
    'g{__reserved="x"} 1',  # reserved label name
    'g{a="1"}',  # no value
    "g",  # nothing but a name
    '{a="1"} 1',  # no metric name
    'g{a="1" b="2"} 1',  # missing comma
    'g{a="1",,b="2"} 1',  # doubled comma
    "# TYPE g",  # TYPE without a type
    "# TYPE g nonsense",  # unknown type
    "# HELP 1bad name",  # invalid metric name
    "# TYPE bad-name gauge",
]


@pytest.mark.parametrize("bad", BAD_LINES)
def test_bad_line_is_counted_and_skipped(bad: str) -> None:
    good = '# HELP g Gauge.\n# TYPE g gauge\ng{a="0"} 0\n'
    tail = 'g{a="9"} 9\n# TYPE h gauge\nh 1\n'
    text = good + bad + "\n" + tail
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(text))  # the reference rejects the whole page
    page = parse_page(text)
    families, errors = page.families, page.errors
    assert errors == 1
    assert ours(families) == reference(good + tail)


def test_garbage_never_raises() -> None:
    rng = random.Random(1)
    alphabet = '{}"\\=,# \t\n\r abc_:019.+-eEInfNa\x00é'
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
        page = parse_page(text)
        families, errors = page.families, page.errors
        assert isinstance(families, dict) and errors >= 0
    assert parse_page("\x00\x01garbage\n{{{\n").errors == 2


def test_bad_lines_in_unwanted_families_cost_nothing() -> None:
    """Lines of a family outside `want` are skipped unread, so they are not parsed, let alone counted."""
    text = '# TYPE skip gauge\nskip{a="1" broken\n# TYPE keep gauge\nkeep 1\n'
    page = parse_page(text, {"keep"})
    families, errors = page.families, page.errors
    assert errors == 0 and list(families) == ["keep"]
    assert parse_page(text).errors == 1


@pytest.mark.parametrize("seed", range(3))
def test_truncated_page_yields_the_complete_lines(seed: int) -> None:
    text = generate_page(seed)
    rng = random.Random(seed)
    for cut in sorted(rng.sample(range(1, len(text)), 60)):
        head = text[:cut]
        complete = head[: head.rfind("\n") + 1]
        page = parse_page(head, truncated=True)
        families, errors = page.families, page.errors
        assert ours(families) == reference(complete)
        assert errors == (1 if head[len(complete) :].strip() else 0)
        parse_page(head)  # without the hint the fragment is parsed as a line; it must not raise either
