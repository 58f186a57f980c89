"""Render normalized samples to the Prometheus text format (0.0.4), once per collection cycle.

Output is deterministic (families by name, series by labels, buckets by edge) so two renders of
the same snapshot are byte-identical and diffs between cycles are meaningful.

Rendering runs every cycle over every series of the node, yet a series keeps its labels from
one cycle to the next: only its value changes. So the text before the value (`name{labels} `)
and the series' sort key are computed once per label set and kept (see `_SeriesCache`); a
cycle is then mostly dictionary lookups, sorting and number formatting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import chain

from exporter.model import NormSample
from exporter.series import parse_le
from llmslo.conventions import LABEL_LE, MetricDef, by_name
from llmslo.gofloat import go_g

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_DEFINED = by_name()
_LABEL_NAME_OK = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_LABEL_NAME_BAD_CHAR = re.compile(r"[^a-zA-Z0-9_]")
_SUFFIX_RANK = {"_bucket": 0, "_sum": 1, "_count": 2}

SeriesKey = tuple  # (family name, suffix, label names, label values), in the sample's own label order
SeriesEntry = tuple  # (sort key within the family, "name{labels} ")


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_name(name: str) -> str:
    if _LABEL_NAME_OK.match(name):
        return name
    fixed = _LABEL_NAME_BAD_CHAR.sub("_", name)
    return fixed if not fixed[:1].isdigit() else "_" + fixed


def format_labels(labels: dict[str, str]) -> str:
    """`{a="1",b="2",le="0.5"}`: names sorted, `le` last with Go float text, values escaped."""
    if not labels:
        return ""
    parts = []
    for name in sorted(k for k in labels if k != LABEL_LE):
        parts.append(f'{_label_name(name)}="{escape_label_value(str(labels[name]))}"')
    if LABEL_LE in labels:
        le = labels[LABEL_LE]
        try:
            le = go_g(parse_le(le))
        except ValueError:
            pass
        parts.append(f'le="{escape_label_value(le)}"')
    return "{" + ",".join(parts) + "}"


def _series_order(sample: NormSample) -> tuple:
    """Sorts a family's series by labels (`le` aside), then buckets, sum, count, then bucket edge.

    The labels are a flat (name, value, name, value, ...) tuple of the sorted pairs: it compares
    exactly as the tuple of pairs would, and a cached key is kept per series, so half the memory
    is worth having.
    """
    labels = tuple(chain.from_iterable(sorted((k, v) for k, v in sample.labels.items() if k != LABEL_LE)))
    try:
        le = parse_le(sample.labels[LABEL_LE]) if LABEL_LE in sample.labels else 0.0
    except ValueError:
        le = 0.0
    return labels, _SUFFIX_RANK.get(sample.suffix, 0), le


def _new_entry(sample: NormSample) -> SeriesEntry:
    """The sort key and the text before the value of a series not in the cache."""
    return _series_order(sample), sample.metric.name + sample.suffix + format_labels(sample.labels) + " "


class _SeriesCache:
    """Series entries by (name, suffix, label names, label values), kept from one render to the next.

    Keyed by the labels in the sample's own order (cheap to build; an equal label set in another
    order is only a second entry). Only all-string label sets are kept: `1`, `1.0` and
    `True` are equal dictionary keys but render differently. Bounded by the output itself: once
    it holds more than twice the last page's series plus some slack (labels that changed since),
    it starts over, so pod churn cannot grow it and it never holds much more than two pages.
    """

    SLACK = 4096

    def __init__(self) -> None:
        self.entries: dict[SeriesKey, SeriesEntry] = {}

    def add(self, key: SeriesKey, sample: NormSample) -> SeriesEntry:
        """The entry of a series not seen before, kept for the next renders when its labels allow."""
        entry = _new_entry(sample)
        if all(type(v) is str for v in sample.labels.values()):
            self.entries[key] = entry
        return entry

    def end_of_render(self, series: int) -> None:
        if len(self.entries) > 2 * series + self.SLACK:
            self.entries.clear()


_CACHE = _SeriesCache()
# Per-family memory. Families are few (conventions defines them); only names from elsewhere could
# grow these, so past this many they start over.
_FAMILY_LIMIT = 4096
_HEADERS: dict[tuple[str, str, str], str] = {}  # (name, help, type) -> the two comment lines
# family name -> (its entries as last rendered, in the order given; the positions to write, sorted and
# without repeated series).
_LAYOUTS: dict[str, tuple[list[SeriesEntry], list[int]]] = {}


def _header(name: str, metric: MetricDef) -> str:
    """`# HELP` and `# TYPE` lines of a family, computed once per definition."""
    key = (name, metric.help, metric.kind)
    text = _HEADERS.get(key)
    if text is None:
        if len(_HEADERS) >= _FAMILY_LIMIT:
            _HEADERS.clear()
        text = _HEADERS[key] = f"# HELP {name} {escape_help(metric.help)}\n# TYPE {name} {metric.kind}\n"
    return text


def _layout(name: str, entries: list[SeriesEntry]) -> list[int]:
    """Which of a family's entries to write, in what order: sorted by series, repeats dropped.

    Collectors hand over the same series in the same order every cycle (the cached entries are
    then the very same objects), so the last render's answer is reused after one list comparison.
    """
    last = _LAYOUTS.get(name)
    if last is not None and last[0] == entries:
        return last[1]
    keys = [entry[0] for entry in entries]
    positions: list[int] = []
    seen: set[str] = set()
    for i in sorted(range(len(entries)), key=keys.__getitem__):  # stable: equal keys keep their order
        text = entries[i][1]
        if text not in seen:  # last line of defence; the collector already de-duplicates
            seen.add(text)
            positions.append(i)
    if len(_LAYOUTS) >= _FAMILY_LIMIT:
        _LAYOUTS.clear()
    _LAYOUTS[name] = (entries, positions)
    return positions


def render(samples: Iterable[NormSample]) -> bytes:
    """The exposition page for these samples, with HELP and TYPE from the conventions module."""
    cached = _CACHE.entries
    families: dict[str, tuple[MetricDef, list[SeriesEntry], list[float]]] = {}
    for s in samples:
        name = s.metric.name
        key = (name, s.suffix, tuple(s.labels), tuple(s.labels.values()))
        try:
            entry = cached.get(key) or _CACHE.add(key, s)
        except TypeError:  # an unhashable label value: render it, keep nothing
            entry = _new_entry(s)
        family = families.get(name)
        if family is None:
            family = families[name] = (_DEFINED.get(name, s.metric), [], [])
        family[1].append(entry)
        family[2].append(s.value)
    out: list[str] = []
    series = 0
    for name in sorted(families):
        metric, entries, values = families[name]
        out.append(_header(name, metric))
        out += [entries[i][1] + go_g(float(values[i])) + "\n" for i in _layout(name, entries)]
        series += len(entries)
    _CACHE.end_of_render(series)
    return "".join(out).encode("utf-8")
