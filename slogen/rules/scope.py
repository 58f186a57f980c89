"""Alerts that prometheus-operator's AlertmanagerConfig routes: the static label `namespace=<the build's namespace>`.

Why: under the operator's default `alertmanagerConfigMatcherStrategy` (OnNamespace) it adds the matcher
`namespace="<the AlertmanagerConfig's namespace>"` to the config's top route and to both sides of each of its
inhibit rules, so an alert is routed (and inhibits or is inhibited) only when it carries that label. The
burn-rate alerts aggregate namespaces away and the health alerts carry the engine's namespace, so as plain
rules they route nowhere. With `KubeOptions.namespace` set, `slogen.catalog` passes every alert rule of the
build (SLO tiers, no-data, bucket-edge, plugins' alerts, health, capacity) through `scoped`; recording rules
are left as they are.

A static label wins over the series' own, so the namespace a series carried (an engine's, a pool's, a tap's)
would be lost: the expression copies it first into `exported_namespace`, the name Prometheus itself gives a
scraped label that a target label overrides (honor_labels: false), so it reads the same as in any
kube-prometheus setup: `namespace` where the thing is monitored from, `exported_namespace` where it runs.
Series without a namespace are left alone (`(.+)` matches no empty label). Annotations still read
`$labels.namespace`: Prometheus expands them from the expression's labels, which keep the series' namespace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from llmslo.conventions import LABEL_NAMESPACE
from slogen.model import Rule

EXPORTED_NAMESPACE = "exported_namespace"  # the series' own namespace on a scoped alert
_COPY = f'"{EXPORTED_NAMESPACE}", "$1", "{LABEL_NAMESPACE}", "(.+)"'
_TAIL = f"  , {_COPY}\n)\n"


def scoped(rule: Rule, namespace: str) -> Rule:
    """`rule` as an alert of `namespace` (unchanged when `namespace` is empty or `rule` records)."""
    if not namespace or not rule.alert:
        return rule
    body = "\n".join(f"  {line}" if line else line for line in rule.expr.rstrip("\n").split("\n"))
    return dataclasses.replace(rule, expr=f"label_replace(\n{body}\n{_TAIL}",
                               labels={**rule.labels, LABEL_NAMESPACE: namespace})


def is_scoped(rule: Rule) -> bool:
    return bool(rule.alert) and rule.expr.startswith("label_replace(\n") and rule.expr.endswith(_TAIL)


def fired_labels(series: Mapping[str, str], rule: Rule) -> dict[str, str]:
    """The labels an alert of `rule` fires with on a series with `series`' labels (the expression's result
    before `scoped` wrapped it): the series', the namespace copied to exported_namespace where `rule` is
    scoped, the rule's static labels over them; sorted (for generated promtool tests' exp_labels)."""
    out = dict(series)
    if is_scoped(rule) and out.get(LABEL_NAMESPACE):
        out[EXPORTED_NAMESPACE] = out[LABEL_NAMESPACE]
    return dict(sorted({**out, **rule.labels}.items()))


__all__ = ["EXPORTED_NAMESPACE", "fired_labels", "is_scoped", "scoped"]
