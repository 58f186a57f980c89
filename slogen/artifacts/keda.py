"""KEDA ScaledObjects for inference pools, from the autoscaling spec and the SLOs.

Why these triggers, and these shapes (docs/autoscaling.md has the long version):
- queue depth and KV-cache utilisation are leading signals: they rise before latency does, and
  they are per-replica quantities, so they use `AverageValue` (desired = ceil(sum / target));
  the HPA divides the sum by every replica, those still loading weights (no series yet) included,
  so the average `kubectl get hpa` shows for KV usage is under the ready replicas' own while
  replicas start; the desired count, ceil(sum / target), does not depend on it;
- the TTFT burn rate is the SLO's own verdict on a SHORT window; it is a fleet-level ratio, not
  a per-replica quantity, so it uses `Value` (desired = ceil(current x burn / target));
- every query returns exactly one sample (`sum`/`max`), `or vector(0)` so a pool with no
  traffic or no data scales to its minimum instead of erroring, and NaN (0/0 with no traffic)
  is filtered before it reaches the HPA;
- metadata values are strings (the CRD says so; KEDA rejects numbers);
- the HPA behaviour scales up a few pods a minute and down one pod per five minutes after ten
  quiet minutes: a vLLM replica needs minutes to load weights, and a pool that flaps pays that
  cold start every time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from llmslo import conventions as c
from slogen import promql as q
from slogen.autoscaling import AutoscalingError, Pool, ScalePolicy
from slogen.errors import SpecError
from slogen.k8smeta import NO_META, ObjectMeta
from slogen.views import SLI_LATENCY, SLOView

KEDA_API_VERSION = "keda.sh/v1alpha1"
OUTPUT = "deploy/generated/keda/scaledobjects.yaml"
TRIGGER_QUEUE = "queue-depth"
TRIGGER_KV = "kv-cache-utilization"
TRIGGER_BURN = "ttft-burn-rate"
TRIGGER_SEATS = "kv-seats"
TRIGGER_WAKE = "wake"
# A wake signal without per_replica only wakes the pool: its threshold is so high that it never asks for a
# second replica (desired = ceil(rate / threshold)), and the engine triggers size the pool once it is up.
WAKE_ONLY_THRESHOLD = 1e6
SEATS_FLOOR = 0.1  # seats below this count as this, so the ratio stays finite when a pool is out of seats


def _num(value: float) -> str:
    """KEDA metadata wants strings; write numbers without a trailing .0."""
    return f"{value:g}"


def _pool_matchers(pool: Pool) -> list[q.Matcher]:
    return [q.eq(label, pool.match[label]) for label in sorted(pool.match)]


def queue_depth_query(pool: Pool) -> str:
    return q.or_zero(q.agg("sum", q.selector(c.REQUESTS_WAITING.name, _pool_matchers(pool))))


def kv_utilization_query(pool: Pool) -> str:
    return q.or_zero(q.agg("sum", q.selector(c.KV_CACHE_USAGE.name, _pool_matchers(pool))))


def seats_selector(pool: Pool) -> str:
    return q.selector(c.CAPACITY.SEATS_P99, _pool_matchers(pool))


def seats_query(pool: Pool) -> str:
    """Seats wanted over seats free (`Value`, target 1): desired = ceil(replicas x min_free / seats), so a pool
    with half the seats it wants doubles (within scale_up), one with twice as many halves (within scale_down)."""
    assert pool.kv_seats is not None
    free = f"clamp_min({q.agg('sum', q.finite(seats_selector(pool)))}, {SEATS_FLOOR:g})"
    return q.or_zero(f"{_num(pool.kv_seats.min_free)} / {free}")


def burn_selector(slo: SLOView, window: str, pool: Pool) -> str:
    """The SLO's recorded error ratio, narrowed by those of the pool's match labels the recording
    keeps (its `by`, e.g. cluster); the others (namespace, model) are aggregated away in it."""
    kept = [q.eq(label, pool.match[label]) for label in sorted(pool.match) if label in slo.by]
    return q.selector(c.SLO.sli_error_ratio(window), [q.eq(c.SLO.LABEL_ID, slo.slo_id), *kept])


def burn_rate_query(slo: SLOView, window: str, pool: Pool) -> str:
    """The worst burn rate among the series left (e.g. per cluster when the pool names none)."""
    return q.or_zero(f"{q.agg('max', q.finite(burn_selector(slo, window, pool)))} / {slo.error_budget:g}")


def find_slo(pool: Pool, slos: Sequence[SLOView]) -> SLOView:
    """The TTFT latency SLO a pool's burn-rate trigger names; AutoscalingError with the fix otherwise."""
    found, problem = slo_problem(pool, slos)
    if problem is not None:
        raise AutoscalingError([problem])
    assert found is not None
    return found


def slo_problem(pool: Pool, slos: Sequence[SLOView]) -> tuple[SLOView | None, SpecError | None]:
    """The TTFT latency SLO a pool's burn-rate trigger names, or the SpecError (at its `slo:` or `window:`
    line) saying why it cannot scale on it: `slogen validate` and `slogen build` both ask this."""
    burn = pool.ttft_burn_rate
    assert burn is not None
    ref = burn.slo
    service, _, name = ref.partition("/")
    for slo in slos:
        if slo.service == service and slo.name == name:
            if slo.sli_kind != SLI_LATENCY or slo.latency_metric != "ttft":
                return None, burn.error(f"{ref!r} is not a TTFT latency SLO",
                                        "point it at an SLO with sli.plugin id llmslo/latency and metric: ttft")
            if slo.windows and burn.window not in slo.windows:
                return None, burn.error(
                    f"the rules record no {burn.window} error ratio for {ref!r}",
                    f"use one of {', '.join(w for w in slo.windows if w in ('1m', '2m', '5m', '10m'))}", "window")
            return slo, None
    known = ", ".join(sorted(f"{s.service}/{s.name}" for s in slos)) or "none"
    return None, burn.error(f"no SLO {ref!r}", f"use service/slo-name of a defined SLO (defined: {known})")


@dataclass(frozen=True)
class Signal:
    """One scaling signal of a pool, as KEDA's triggers and the HPA's external metrics both read it."""

    name: str  # queue-depth, kv-cache-utilization, kv-seats, ttft-burn-rate
    metric_type: str  # AverageValue (a per-replica quantity) or Value (a fleet-level ratio)
    query: str  # exactly one sample; 0 when there is no traffic or no data
    target: float
    series: str  # a selector for the series the query reads (prometheus-adapter discovers metrics by it)


def signals(pool: Pool, slos: Sequence[SLOView]) -> list[Signal]:
    out = []
    matchers = _pool_matchers(pool)
    if pool.queue_depth:
        out.append(Signal(TRIGGER_QUEUE, "AverageValue", queue_depth_query(pool), pool.queue_depth.per_replica,
                          q.selector(c.REQUESTS_WAITING.name, matchers)))
    if pool.kv_cache_utilization:
        out.append(Signal(TRIGGER_KV, "AverageValue", kv_utilization_query(pool), pool.kv_cache_utilization.per_replica,
                          q.selector(c.KV_CACHE_USAGE.name, matchers)))
    if pool.kv_seats:
        out.append(Signal(TRIGGER_SEATS, "Value", seats_query(pool), 1.0, seats_selector(pool)))
    if pool.ttft_burn_rate:
        slo, window = find_slo(pool, slos), pool.ttft_burn_rate.window
        out.append(Signal(TRIGGER_BURN, "Value", burn_rate_query(slo, window, pool), pool.ttft_burn_rate.above,
                          burn_selector(slo, window, pool)))
    return out


def wake_query(pool: Pool) -> str:
    """Requests per second in front of the pool, as one sample (0 with none): from the gateway or ingress,
    so it exists while the pool has no replica."""
    assert pool.wake is not None
    if pool.wake.query:
        return q.or_zero(f"sum({pool.wake.query})")
    matchers = [q.eq(label, value) for label, value in pool.wake.selector]
    return q.or_zero(q.agg("sum", f"rate({q.selector(pool.wake.metric, matchers)}[{pool.wake.window}])"))


def wake_trigger(pool: Pool) -> dict[str, Any]:
    """The KEDA trigger that takes the pool from zero to one replica: active (activationThreshold) as soon as
    any request arrives in front of it; with `per_replica`, it also sizes the pool by request rate."""
    assert pool.wake is not None
    trigger = _trigger(Signal(TRIGGER_WAKE, "AverageValue", wake_query(pool),
                              pool.wake.per_replica or WAKE_ONLY_THRESHOLD, ""), pool)
    trigger["metadata"]["activationThreshold"] = "0"
    return trigger


def behavior(pool: Pool) -> dict[str, Any]:
    """The HPA `behavior`: up by the larger of N pods and N percent a period, so small pools still
    grow by whole pods; down one pod a period, after a quiet window."""
    return {"scaleUp": scale_policy(pool.scale_up, "Max"), "scaleDown": scale_policy(pool.scale_down, "Min")}


def _trigger(sig: Signal, pool: Pool) -> dict[str, Any]:
    trigger: dict[str, Any] = {
        "type": "prometheus",
        "name": sig.name,
        "metricType": sig.metric_type,
        "metadata": {
            "serverAddress": pool.prometheus,
            "query": sig.query,
            "threshold": _num(sig.target),
            "ignoreNullValues": "false",  # the queries answer 0 themselves; an empty result is a real error
        },
    }
    if pool.authentication_ref:
        trigger["metadata"]["authModes"] = "bearer"
        trigger["authenticationRef"] = {"name": pool.authentication_ref}
    return trigger


def scale_policy(p: ScalePolicy, select: str) -> dict[str, Any]:
    """One direction of an HPA `behavior` (KEDA passes it through to the HPA it creates)."""
    policies = [{"type": "Pods", "value": p.max_pods, "periodSeconds": p.period_s}]
    if p.max_percent:
        policies.append({"type": "Percent", "value": p.max_percent, "periodSeconds": p.period_s})
    return {"stabilizationWindowSeconds": p.stabilization_s, "selectPolicy": select, "policies": policies}


def scaled_object(pool: Pool, slos: Sequence[SLOView], meta: ObjectMeta = NO_META) -> dict[str, Any]:
    triggers = [_trigger(sig, pool) for sig in signals(pool, slos)]
    if pool.wake is not None:
        triggers.append(wake_trigger(pool))
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": meta.metadata(pool.name, pool.namespace, managed=MANAGED_LABELS),
        "spec": {
            "scaleTargetRef": {"apiVersion": pool.target_api_version, "kind": pool.target_kind,
                               "name": pool.target_name},
            "minReplicaCount": pool.min_replicas,
            "maxReplicaCount": pool.max_replicas,
            "pollingInterval": pool.polling_interval_s,
            "cooldownPeriod": pool.cooldown_period_s,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(pool)}},
            "triggers": triggers,
        },
    }


MANAGED_LABELS = {"app.kubernetes.io/managed-by": "slogen", "app.kubernetes.io/part-of": "llmslo"}
HEADER = "# Generated by `slogen build` from the autoscaling specs (docs/autoscaling.md). Do not edit.\n"


def render(objects: Sequence[Mapping[str, Any]], header: str = HEADER) -> str:
    if not objects:
        return header + "# No pools are configured.\n"
    return header + "".join(
        "---\n" + yaml.safe_dump(dict(o), sort_keys=False, default_flow_style=False, width=120) for o in objects)


def keda_files(pools: Sequence[Pool], slos: Sequence[SLOView], meta: ObjectMeta = NO_META) -> dict[str, str]:
    """Relative path -> the ScaledObjects of every pool (sorted by namespace and name)."""
    objects = [scaled_object(p, slos, meta) for p in sorted(pools, key=lambda p: (p.namespace, p.name))]
    return {OUTPUT: render(objects)} if objects else {}
