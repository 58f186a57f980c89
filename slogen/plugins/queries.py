"""PromQL building blocks every built-in SLI plugin shares: bucket bounds as matchers and labels, the measurable
count of a latency histogram, aggregation, and the labels of synthesized test series."""

from __future__ import annotations

import re

from llmslo import conventions as c
from slogen import promql
from slogen.plugins.contract import PluginError
from slogen.promql import Matcher


def glob_example(globs: str) -> str:
    """A model name that the first glob matches (for synthesized test series)."""
    first = next((g.strip() for g in globs.split(",") if g.strip()), "model")
    return first.replace("*", "x").replace("?", "x")


def le_regex(threshold: float) -> str:
    """A regex matching a bucket bound however it is spelled: `1`, `1.0`, `0.5`, `0.50`.

    Prometheus 3 and the Python client write `1.0`; Go clients and Prometheus 2 write `1`.
    """
    text = repr(float(threshold))
    if "e" in text or "inf" in text or "nan" in text:
        raise PluginError(f"threshold {threshold!r} must be a plain decimal bucket bound", "threshold",
                          "write the bound as it appears in the histogram, e.g. 0.5 or 2.5")
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0")
    if not frac:
        return whole + r"(\.0*)?"
    return whole + r"\." + frac + "0*"


def le_label(threshold: float) -> str:
    """The bound as the Python client (the tap, the simulator) spells it: `0.5`, `1.0`."""
    return repr(float(threshold))


def aggregate(inner: str, by: tuple[str, ...]) -> str:
    return promql.agg("sum", inner, by)


def fixture_labels(base: dict[str, str], matchers: list[Matcher], by: tuple[str, ...]) -> dict[str, str] | None:
    """Labels for a synthesized series satisfying `matchers`; None when a regex matcher defeats us."""
    labels = dict(base)
    for name, op, value in matchers:
        if op == "=":
            labels[name] = value.replace('\\"', '"').replace("\\\\", "\\")
        elif op == "=~":
            candidate = value.replace(".*", "x").replace(".+", "x").replace("\\\\", "").split("|")[0]
            if not re.fullmatch(value.replace("\\\\", "\\"), candidate):
                return None
            labels[name] = candidate
        elif op in ("!=", "!~"):
            labels.setdefault(name, "fixture")
    for label in by:
        labels.setdefault(label, f"{label}-a")
    return labels


def measurable(count_sel: str, bucket_sel: str) -> str:
    """The count of the requests that can be measured against the threshold: each `_count` series only
    where the same series (ignoring `le`) has the bucket at the threshold.

    A series without that edge (an engine upgrade or a bucket configuration that dropped it) is neither
    good nor bad: counted in the total, all its requests would be too slow (a healthy cluster pages);
    counted nowhere once the old pods' buckets leave the windows while its count goes on, the long
    windows' error ratio of a cluster whose users are all too slow falls towards 0. Its one signal is
    the bucket-edge alert (rules/bucket_alerts.py), which counts exactly these series.
    """
    return f"{promql.rate(count_sel)} and {promql.ignoring((c.LABEL_LE,))} {promql.rate(bucket_sel)}"
