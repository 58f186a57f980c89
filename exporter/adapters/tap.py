"""The goodput tap: its families already carry normalized names (conventions.TAP_METRICS).

They pass through unchanged except that the node exporter's identity labels are added, so goodput
joins the engine series of the same pod. The tap's own `model` label wins over the identity's.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.adapters.base import Adapter, Output, values
from exporter.model import MetricFamily, NormSample
from llmslo import conventions as c

KIND = c.ENGINE_TAP


def family_name(metric: c.MetricDef) -> str:
    """The key the parser files a metric under: counter families lose their `_total`."""
    if metric.kind == "counter" and metric.name.endswith("_total"):
        return metric.name[: -len("_total")]
    return metric.name


WANTED = frozenset(family_name(m) for m in c.TAP_METRICS)


def adapt(families: Mapping[str, MetricFamily], identity: Mapping[str, str]) -> list[NormSample]:
    out = Output(identity, KIND)
    for metric in c.TAP_METRICS:
        fam = families.get(family_name(metric))
        own = tuple(label for label in metric.labels if label != c.LABEL_MODEL)
        if metric.kind == "histogram":
            out.histogram(metric, fam, model_label=c.LABEL_MODEL, keep=own)
            continue
        for s in values(fam):
            out.add(metric, s.value, s.labels.get(c.LABEL_MODEL), {label: s.labels.get(label, "") for label in own})
    return out.samples()


ADAPTER = Adapter(KIND, WANTED, adapt, detect_names=WANTED)  # the tap's names share the llm_ prefix
