"""Render normalized samples to the Prometheus text format (0.0.4), once per collection cycle.

Output is deterministic (families by name, series by labels, buckets by edge) so two renders of
the same snapshot are byte-identical and diffs between cycles are meaningful.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from llmslo.conventions import LABEL_LE, MetricDef, by_name
from exporter.model import NormSample
from exporter.series import go_float, parse_le

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_DEFINED = by_name()
_LABEL_NAME_OK = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_LABEL_NAME_BAD_CHAR = re.compile(r"[^a-zA-Z0-9_]")
_SUFFIX_RANK = {"_bucket": 0, "_sum": 1, "_count": 2}


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
            le = go_float(parse_le(le))
        except ValueError:
            pass
        parts.append(f'le="{escape_label_value(le)}"')
    return "{" + ",".join(parts) + "}"


def _series_order(sample: NormSample) -> tuple:
    labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != LABEL_LE))
    try:
        le = parse_le(sample.labels[LABEL_LE]) if LABEL_LE in sample.labels else 0.0
    except ValueError:
        le = 0.0
    return labels, _SUFFIX_RANK.get(sample.suffix, 0), le


def render(samples: Iterable[NormSample]) -> bytes:
    """The exposition page for these samples, with HELP and TYPE from the conventions module."""
    families: dict[str, tuple[MetricDef, list[NormSample]]] = {}
    for s in samples:
        entry = families.get(s.metric.name)
        if entry is None:
            families[s.metric.name] = (_DEFINED.get(s.metric.name, s.metric), [s])
        else:
            entry[1].append(s)
    lines: list[str] = []
    for name in sorted(families):
        metric, members = families[name]
        lines.append(f"# HELP {name} {escape_help(metric.help)}")
        lines.append(f"# TYPE {name} {metric.kind}")
        seen: set[str] = set()
        for s in sorted(members, key=_series_order):
            series = name + s.suffix + format_labels(s.labels)
            if series in seen:  # last line of defence; the collector already de-duplicates
                continue
            seen.add(series)
            lines.append(f"{series} {go_float(float(s.value))}")
    lines.append("")
    return "\n".join(lines).encode("utf-8")
