"""One Markdown runbook per generated alert, rendered from jinja2 templates.

Why generated: a runbook that names the wrong series is worse than none at 3 a.m. The PromQL in
every runbook is built here from `llmslo.conventions` (the templates only place it), and the
alert's SLO, objective, windows and tiers come from the same model as the alert itself. The
templates hold the serving knowledge: what a TTFT or TPOT burn usually means on an LLM engine
and what to look at, in order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

from llmslo import conventions as c
from llmslo import gateways as gw
from slogen import promql as q
from slogen.artifacts import gateway_panels as gp
from slogen.artifacts.dashboards import goodput_ratio
from slogen.panels import ENGINE_BY
from slogen.paths import FLEET_DASHBOARD_FILE, slo_dashboard_path
from slogen.plugins.llm import le_regex, measurable
from slogen.rules import injector, isolation
from slogen.rules.alerts import runbook_path  # docs/runbooks/<alertname>.md, the alerts' runbook_url
from slogen.rules.scope import EXPORTED_NAMESPACE
from slogen.settings import DEFAULT_NAMESPACE
from slogen.views import (
    ALERT_BUCKET_EDGE,
    ALERT_BURN,
    ALERT_NO_DATA,
    SLI_AVAILABILITY,
    SLI_GOODPUT,
    SLI_KV_HEADROOM,
    SLI_LATENCY,
    AlertView,
    SLOView,
    window_seconds,
)

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "templates"
WINDOW = "5m"  # rate window of the diagnosis queries: short, to see what is happening now

# Topics with their own template (runbook_<topic>.md.j2).
TOPIC_TTFT = "ttft"
TOPIC_TPOT = "tpot"
TOPIC_E2E = "e2e"
TOPIC_GOODPUT = "goodput"
TOPIC_AVAILABILITY = "availability"
TOPIC_SLO = "slo"  # any other SLI (Sloth events/raw): generic burn-rate guidance
TOPIC_NO_DATA = "no_data"
TOPIC_KV_SATURATION = "kv_saturation"
TOPIC_GPU_HEALTH = "gpu_health"
TOPIC_TARGET_DOWN = "target_down"  # the exporter cannot read an engine
TOPIC_TAP_REFUSALS = "tap_refusals"  # a goodput tap refuses requests at its own limits
TOPIC_TAP_CONFIG_DRIFT = "tap_config_drift"  # a goodput tap runs on other SLO files than the rules
TOPIC_BUCKET_EDGE = "bucket_edge"  # engines whose latency histogram lacks an SLI's threshold (bucket_alerts.py)
TOPIC_ENGINE_REFUSALS = "engine_refusals"  # an engine refuses requests at its own queue caps or overload
# the inference pool's isolation (rules/isolation.py): a foreign pod on the pool, a serving pod off it
TOPIC_POOL_FOREIGN_POD, TOPIC_SERVING_OFF_POOL = isolation.TOPIC_POOL_FOREIGN_POD, isolation.TOPIC_SERVING_OFF_POOL
TOPIC_POOL_UNWATCHED = isolation.TOPIC_POOL_UNWATCHED
TOPIC_TAP_INJECTOR = injector.TOPIC_TAP_INJECTOR  # the tap injector unscraped or failing (rules/injector.py)
TOPICS = (TOPIC_TTFT, TOPIC_TPOT, TOPIC_E2E, TOPIC_GOODPUT, TOPIC_AVAILABILITY, TOPIC_SLO, TOPIC_NO_DATA,
          TOPIC_KV_SATURATION, TOPIC_GPU_HEALTH, TOPIC_TARGET_DOWN, TOPIC_TAP_REFUSALS, TOPIC_TAP_CONFIG_DRIFT,
          TOPIC_BUCKET_EDGE, TOPIC_POOL_FOREIGN_POD, TOPIC_SERVING_OFF_POOL, TOPIC_POOL_UNWATCHED,
          TOPIC_ENGINE_REFUSALS, TOPIC_TAP_INJECTOR)


@dataclass(frozen=True)
class EngineDiscovery:
    """Pod label and namespace names the kubectl commands use (the exporter's discovery defaults; the exporter's
    namespace is the install's, llmslo.yaml `namespace`)."""

    engine_label: str = "llmslo.io/engine"
    exporter_namespace: str = DEFAULT_NAMESPACE
    exporter_daemonset: str = "llmslo-exporter"


def topic(alert: AlertView) -> str:
    if alert.kind == ALERT_NO_DATA:
        return TOPIC_NO_DATA
    if alert.kind == ALERT_BUCKET_EDGE:
        return TOPIC_BUCKET_EDGE
    if alert.kind in (TOPIC_KV_SATURATION, TOPIC_GPU_HEALTH, TOPIC_TARGET_DOWN, TOPIC_TAP_REFUSALS,
                      TOPIC_TAP_CONFIG_DRIFT, TOPIC_POOL_FOREIGN_POD, TOPIC_SERVING_OFF_POOL, TOPIC_POOL_UNWATCHED,
                      TOPIC_ENGINE_REFUSALS, TOPIC_TAP_INJECTOR):
        return alert.kind
    slo = alert.slo
    if slo is None:
        return TOPIC_SLO
    if slo.sli_kind == SLI_LATENCY:
        return {"ttft": TOPIC_TTFT, "tpot": TOPIC_TPOT, "itl": TOPIC_TPOT, "e2e": TOPIC_E2E}.get(
            slo.latency_metric, TOPIC_SLO)
    if slo.sli_kind == SLI_GOODPUT:
        return TOPIC_GOODPUT
    if slo.sli_kind == SLI_AVAILABILITY:
        return TOPIC_AVAILABILITY
    if slo.sli_kind == SLI_KV_HEADROOM:
        return TOPIC_KV_SATURATION
    return TOPIC_SLO


def le_matcher(threshold: float) -> q.Matcher:
    """Match a bucket edge exactly as the SLI's rule does, so the runbook's query agrees with the alert."""
    return q.regex(c.LABEL_LE, le_regex(threshold))


# --------------------------------------------------------------------------------------
# The PromQL a runbook shows, by name
# --------------------------------------------------------------------------------------
def _slo_queries(slo: SLOView) -> dict[str, str]:
    m = [q.eq(c.SLO.LABEL_ID, slo.slo_id)]
    windows = sorted({w for t in slo.tiers for w in (t.long_window, t.short_window)} or {slo.base_window},
                     key=window_seconds)
    out = {
        "burn_rates": "\n".join(
            f"{q.selector(c.SLO.sli_error_ratio(w), m)} / {slo.error_budget:g}   # {w}" for w in windows),
        "budget_left": q.selector(c.SLO.PERIOD_ERROR_BUDGET_REMAINING, m),
        "current_burn_rate": q.selector(c.SLO.CURRENT_BURN_RATE, m),
        "sli_now": f"1 - {q.selector(c.SLO.sli_error_ratio(slo.base_window), m)}",
        "firing": q.agg("sum", q.selector(c.PROM_ALERTS, [q.eq(c.SLO.LABEL_ID, slo.slo_id),
                                                          q.eq(c.LABEL_ALERTSTATE, c.ALERTSTATE_FIRING)]),
                        (c.LABEL_ALERTNAME, c.SLO.LABEL_TIER, c.SLO.LABEL_ALERT_SEVERITY)),
    }
    if slo.page_min_bad_events:  # the low-traffic guard's count: bad events in each page tier's long window
        longs = sorted({t.long_window for t in slo.tiers if t.severity == "page"}, key=window_seconds)
        out["bad_events"] = "\n".join(
            f"{q.selector(c.SLO.sli_errors_rate(w), m)} * {window_seconds(w)}   # {w}" for w in longs)
    return out


def _fleet_queries(slo: SLOView | None) -> dict[str, str]:
    # `cluster` first: read from a fleet store, two clusters' pods of one name stay apart; node, kind and model
    # keep engines configured as static targets (no pod) apart (as on the dashboards).
    per_engine = ENGINE_BY
    tap = [q.eq(c.LABEL_SLO_CLASS, slo.slo_class)] if slo and slo.slo_class else []
    threshold = slo.threshold if slo and slo.threshold else None
    out = {
        "queue_depth": q.agg("sum", q.selector(c.REQUESTS_WAITING.name), per_engine),
        "running": q.agg("sum", q.selector(c.REQUESTS_RUNNING.name), per_engine),
        "kv_usage": q.agg("max", q.selector(c.KV_CACHE_USAGE.name), per_engine),
        "kv_free_tokens": q.agg("sum", f"{q.selector(c.KV_BLOCKS_FREE.name)} * {q.selector(c.KV_BLOCK_SIZE.name)}",
                                per_engine),
        "preemptions": q.sum_rate(c.PREEMPTIONS.name, [], WINDOW, per_engine),
        "prefix_hit_rate": q.ratio(q.sum_rate(c.PREFIX_CACHE_HITS.name, [], WINDOW, per_engine),
                                   q.sum_rate(c.PREFIX_CACHE_QUERIES.name, [], WINDOW, per_engine)),
        "prompt_tokens_per_request": q.ratio(q.sum_rate(c.PROMPT_TOKENS.name, [], WINDOW, per_engine),
                                             q.sum_rate(c.REQUESTS_FINISHED.name, [], WINDOW, per_engine)),
        "output_tokens_per_request": q.ratio(q.sum_rate(c.GENERATION_TOKENS.name, [], WINDOW, per_engine),
                                             q.sum_rate(c.REQUESTS_FINISHED.name, [], WINDOW, per_engine)),
        "finished_by_reason": q.sum_rate(c.REQUESTS_FINISHED.name, [], WINDOW, (*per_engine, c.LABEL_REASON)),
        "engine_ttft_p99": q.histogram_quantile(0.99, c.TTFT, [], WINDOW, per_engine),
        "queue_time_p99": q.histogram_quantile(0.99, c.QUEUE_TIME, [], WINDOW, per_engine),
        "engine_tpot_p99": q.histogram_quantile(0.99, c.TPOT, [], WINDOW, per_engine),
        "itl_p99": q.histogram_quantile(0.99, c.ITL, [], WINDOW, per_engine),
        "e2e_p99": q.histogram_quantile(0.99, c.E2E, [], WINDOW, per_engine),
        "tap_ttft_p99": q.histogram_quantile(0.99, c.TAP_TTFT, tap, WINDOW, (c.LABEL_MODEL,)),
        "tap_tpot_p99": q.histogram_quantile(0.99, c.TAP_TPOT, tap, WINDOW, (c.LABEL_MODEL,)),
        "tap_outcomes": q.sum_rate(c.TAP_REQUESTS.name, tap, WINDOW, (c.LABEL_MODEL, c.LABEL_OUTCOME)),
        # Requests that never completed because they were too late: what a hung engine looks like at the tap.
        "tap_late": q.sum_rate(c.TAP_REQUESTS.name, [*tap, q.regex(c.LABEL_OUTCOME, "|".join(c.TAP_LATE_OUTCOMES))],
                               WINDOW, (c.LABEL_MODEL, c.LABEL_OUTCOME)),
        # As the SLI counts: neutral outcomes out of the total, a class in outage at 0 (as on the dashboards).
        "goodput_by_class": goodput_ratio(tap, (c.LABEL_SLO_CLASS,), WINDOW),
        # The tap's own refusals (never request outcomes), next to the requests it did relay, per tap.
        "tap_refusals": q.sum_rate(c.TAP_REFUSALS.name, [], WINDOW, (*per_engine, c.LABEL_REASON)),
        "tap_capacity_refusals": q.sum_rate(
            c.TAP_REFUSALS.name, [q.regex(c.LABEL_REASON, "|".join(c.REFUSED_CAPACITY_REASONS))], WINDOW, per_engine),
        "tap_requests": q.sum_rate(c.TAP_REQUESTS.name, [], WINDOW, per_engine),
        # The engine's own refusals (its queue caps, overload) by reason, and their share of what it was asked: each
        # is also an `error` in llm_requests_finished_total, so the finished requests are all it was asked.
        "engine_refusals": q.sum_rate(c.REQUESTS_REJECTED.name, [], WINDOW, (*per_engine, c.LABEL_REASON)),
        "engine_refused_share": "({refused}) / ({finished})".format(
            refused=q.sum_rate(c.REQUESTS_REJECTED.name, [q.regex(c.LABEL_REASON, "|".join(c.ENGINE_REFUSAL_REASONS))],
                               WINDOW, per_engine),
            finished=q.sum_rate(c.REQUESTS_FINISHED.name, [], WINDOW, per_engine)),
        "waiting_by_reason": q.agg("sum", q.selector(c.REQUESTS_WAITING_BY_REASON.name), (*per_engine, c.LABEL_REASON)),
        "tap_config_hashes": q.agg("count", q.selector(c.TAP_CONFIG_INFO.name), (c.LABEL_CONFIG_HASH,)),
        "tap_config_by_pod": q.agg("max", q.selector(c.TAP_CONFIG_INFO.name), (*per_engine, c.LABEL_CONFIG_HASH)),
        "tap_config_reload_failures": f"increase({q.selector(c.TAP_CONFIG_RELOAD_FAILURES.name)}[1h]) > 0",
        "tap_refused_share": "({refused}) / ({refused} + {relayed})".format(
            refused=q.sum_rate(c.TAP_REFUSALS.name, [q.regex(c.LABEL_REASON, "|".join(c.REFUSED_CAPACITY_REASONS))],
                               WINDOW, per_engine),
            relayed=q.sum_rate(c.TAP_REQUESTS.name, [], WINDOW, per_engine)),
        "goodput_tokens": q.ratio(q.sum_rate(c.GOODPUT_TOKENS.name, tap, WINDOW, (c.LABEL_MODEL,)),
                                  q.sum_rate(c.OUTPUT_TOKENS.name, tap, WINDOW, (c.LABEL_MODEL,))),
        "gpu_up": f"{q.selector(c.GPU_UP.name)} == 0",
        "gpu_xid": f"increase({q.selector(c.GPU_XID_ERRORS.name)}[1h]) > 0",
        "gpu_ecc": f"increase({q.selector(c.GPU_ECC_ERRORS.name, [q.eq(c.LABEL_ECC_TYPE, 'uncorrected')])}[1h]) > 0",
        "gpu_throttle": f"{q.selector(c.GPU_CLOCK_EVENT.name)} == 1",
        "gpu_hbm_used": f"{q.selector(c.GPU_MEMORY_USED.name)} / {q.selector(c.GPU_MEMORY_TOTAL.name)}",
        "gpu_temperature": q.selector(c.GPU_TEMPERATURE.name),
        "targets_down": f"{q.selector(c.EXPORTER_TARGET_UP.name)} == 0",
        "target_errors": q.selector(c.EXPORTER_LAST_ERROR.name),
        "last_cycle_age": f"time() - {q.selector(c.EXPORTER_LAST_CYCLE.name)}",
        "pool_holders": isolation.holders_by_pool(),
        "node_pools": isolation.nodes_by_pool(),
        "node_pools_metric": c.EXPORTER_NODE_POOL_INFO.name,
        "mapping_down": f"{q.selector(c.EXPORTER_GPU_POD_MAPPING_UP.name)} == 0",
        "injector_errors": f"sum by (reason) (rate({q.selector(c.TAP_INJECTOR_ERRORS.name)}[10m]))",
        "injector_injected": f"sum(increase({q.selector(c.TAP_INJECTOR_INJECTED.name)}[1h]))",
    }
    if threshold is not None and slo is not None and slo.latency_metric in ("ttft", "tpot", "e2e"):
        out["share_over_threshold"] = _share_over_threshold(slo, tap, threshold)
    return out


def _share_over_threshold(slo: SLOView, tap: list[q.Matcher], threshold: float) -> str:
    """The share of the SLI's requests over its threshold, per model, read off the histogram the SLI reads."""
    hist = {"ttft": c.TAP_TTFT, "tpot": c.TAP_TPOT, "e2e": c.TAP_E2E}[slo.latency_metric]
    if slo.source != "tap":
        hist = {"ttft": c.TTFT, "tpot": c.TPOT, "e2e": c.E2E}[slo.latency_metric]
    matchers = tap if slo.source == "tap" else []
    model = c.LABEL_MODEL
    if slo.source in gw.GATEWAYS:  # the gateway's own histogram and model label, as its SLI reads them
        hist, matchers = gp.latency_histogram(slo, [])
        model = gw.GATEWAYS[slo.source].model_label
    bucket = q.selector(hist.bucket(), [*matchers, le_matcher(threshold)])
    within = q.agg("sum", q.rate(bucket, WINDOW), (model,))
    # the count of the series that have the bucket, as the SLI counts (a tap's series of an earlier
    # configuration, whose edges differ, would read every one of its requests as over the threshold)
    total = q.agg("sum", measurable(q.selector(hist.count(), matchers), bucket).replace(q.WINDOW, WINDOW), (model,))
    return f"1 - ({within}) / ({total})"


# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,  # a typo in a template fails the build, not the reader
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_runbook(alert: AlertView, discovery: EngineDiscovery = EngineDiscovery(),
                   env: jinja2.Environment | None = None) -> str:
    env = env or _environment()
    slo = alert.slo
    context = {
        "alert": alert,
        "slo": slo,
        "topic": topic(alert),
        "q": {**_fleet_queries(slo), **(_slo_queries(slo) if slo else {})},
        "d": discovery,
        "labels": {
            "tier": c.SLO.LABEL_TIER, "severity": c.SLO.LABEL_ALERT_SEVERITY, "slo_id": c.SLO.LABEL_ID,
            "long_window": c.SLO.LABEL_LONG_WINDOW, "short_window": c.SLO.LABEL_SHORT_WINDOW,
            # where the engine's (tap's, pool's) namespace is on the alert: a build with a namespace gives every
            # alert that one (slogen.rules.scope) and keeps the series' own as exported_namespace
            "engine_namespace": EXPORTED_NAMESPACE if alert.labels.get(c.LABEL_NAMESPACE) else c.LABEL_NAMESPACE,
        },
        "tiers": sorted(alert.tiers or (slo.tiers if slo else ()), key=lambda t: -t.factor),
        "slo_dashboard": "../../" + slo_dashboard_path(slo.slo_id) if slo else "",
        "fleet_dashboard": "../../" + FLEET_DASHBOARD_FILE,
        "capacity": {"page": c.CAPACITY.SEATS_EXHAUSTION, "low": c.CAPACITY.SEATS_LOW, "free": c.CAPACITY.POOL_FREE_TOKENS,
                     "net": c.CAPACITY.POOL_FREE_TOKENS_NET, "minutes": c.CAPACITY.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION,
                     "seats": c.CAPACITY.POOL_SEATS_P99, "waiting": c.CAPACITY.POOL_WAITING},
    }
    text = env.get_template(f"runbook_{topic(alert)}.md.j2").render(**context)
    return text.rstrip("\n") + "\n"


def runbook_files(alerts: Sequence[AlertView], discovery: EngineDiscovery = EngineDiscovery()) -> dict[str, str]:
    """Relative path -> Markdown for every alert name (tiers sharing a name share a runbook)."""
    return dict(iter_runbook_files(alerts, discovery))


def iter_runbook_files(alerts: Sequence[AlertView], discovery: EngineDiscovery = EngineDiscovery()
                       ) -> Iterator[tuple[str, str]]:
    """The same, one (path, Markdown) at a time, rendered as they are taken."""
    env = _environment()
    done: set[str] = set()
    for alert in sorted(alerts, key=lambda a: a.name):
        path = runbook_path(alert.name)
        if path not in done:
            done.add(path)
            yield path, render_runbook(alert, discovery, env)


__all__ = ["ALERT_BURN", "ALERT_NO_DATA", "iter_runbook_files", "runbook_files", "runbook_path", "render_runbook", "topic", "TOPICS"]
