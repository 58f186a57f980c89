"""HPA v2 and prometheus-adapter rules: the KEDA ScaledObjects' equivalent for clusters without KEDA.

Same pools, signals, queries, targets and behaviour as `keda.py` (both read `keda.signals`); what
differs is the plumbing. prometheus-adapter serves each signal as an external metric (one rule
per pool and signal, with the query as it stands, so every query still returns exactly one
sample and answers 0 without traffic), and a plain `autoscaling/v2` HorizontalPodAutoscaler
reads them. Two things KEDA does that an HPA cannot: scale to zero (an HPA's minimum is 1 without
the alpha HPAScaleToZero gate) and tell "no series yet" from an error (the adapter lists a metric
only once its series exist; until then the HPA holds the pool where it is).

The files go to their own folder and are not listed in `deploy/generated/kustomization.yaml`:
apply them instead of the KEDA objects, never next to them (two autoscalers would fight over
one Deployment).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from slogen.artifacts.keda import HEADER, MANAGED_LABELS, Signal, behavior, render, signals
from slogen.autoscaling import Pool
from slogen.k8smeta import NO_META, ObjectMeta
from slogen.views import SLOView

OUTPUT_DIR = "deploy/generated/hpa"
HPAS = f"{OUTPUT_DIR}/horizontalpodautoscalers.yaml"
ADAPTER_RULES = f"{OUTPUT_DIR}/prometheus-adapter-rules.yaml"


def external_metric_name(pool: Pool, sig: Signal) -> str:
    """Unique per pool and signal across the cluster (the adapter's external metrics are not namespaced)."""
    return f"llmslo_{pool.namespace}_{pool.name}_{sig.name}".replace("-", "_")


def quantity(value: float) -> str:
    """A Kubernetes quantity: whole numbers as they are, fractions in thousandths (0.85 -> 850m)."""
    if float(value).is_integer():
        return str(int(value))
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def adapter_rule(pool: Pool, sig: Signal) -> dict[str, Any]:
    return {
        "seriesQuery": sig.series,
        "resources": {"namespaced": False},  # the query names the pool's labels itself
        "name": {"as": external_metric_name(pool, sig)},
        "metricsQuery": sig.query,
    }


def _target(sig: Signal) -> dict[str, Any]:
    if sig.metric_type == "AverageValue":
        return {"type": "AverageValue", "averageValue": quantity(sig.target)}
    return {"type": "Value", "value": quantity(sig.target)}


def horizontal_pod_autoscaler(pool: Pool, sigs: Sequence[Signal], meta: ObjectMeta = NO_META) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta.metadata(pool.name, pool.namespace, managed=MANAGED_LABELS),
        "spec": {
            "scaleTargetRef": {"apiVersion": pool.target_api_version, "kind": pool.target_kind, "name": pool.target_name},
            "minReplicas": max(1, pool.min_replicas),
            "maxReplicas": pool.max_replicas,
            "behavior": behavior(pool),
            "metrics": [
                {"type": "External", "external": {"metric": {"name": external_metric_name(pool, s)}, "target": _target(s)}}
                for s in sigs
            ],
        },
    }


def hpa_files(pools: Sequence[Pool], slos: Sequence[SLOView], meta: ObjectMeta = NO_META) -> dict[str, str]:
    """Relative path -> the HPAs, and the prometheus-adapter rules they read (none without pools)."""
    ordered = sorted(pools, key=lambda p: (p.namespace, p.name))
    if not ordered:
        return {}
    per_pool = [(p, signals(p, slos)) for p in ordered]
    header = HEADER + "# HPA v2 alternative to deploy/generated/keda: apply one or the other (docs/autoscaling.md).\n"
    rules = {"externalRules": [adapter_rule(p, s) for p, sigs in per_pool for s in sigs]}
    return {
        HPAS: render([horizontal_pod_autoscaler(p, sigs, meta) for p, sigs in per_pool], header),
        ADAPTER_RULES: header + "# prometheus-adapter config (the Helm chart takes this list as rules.external).\n"
        + yaml.safe_dump(rules, sort_keys=False, default_flow_style=False, width=120),
    }
