"""The tap injector watched: an alert when pods may be starting without the tap, in a build that installs it.

Why: the webhook's failurePolicy is Ignore, so that its outage never blocks a rollout; the price is that a pod the
API server could not get an answer for starts without the tap, and its requests are in no goodput or tap latency
SLI. Nothing else says so until every tapped pod is gone (then the SLOs' no-data alerts fire): a partial loss of
the tap looks healthy. Two arms, one alert:

- no injector scraped (`absent`: its counters are on its page from the start, at 0): not running, not scraped
  (its PodMonitor, its NetworkPolicy), or removed;
- its reviews failing (conventions.TAP_INJECTOR_FAILURE_REASONS, per cluster): a TLS handshake the API server
  refuses (the webhook configuration's caBundle is not the serving certificate's CA: cert-manager's CA
  injector not running, or a renewed CA), the webhook's own failure, timeouts, connections past its cap.

A ticket (severity warning): pods that started meanwhile are served, only unmeasured; restarting them once the
injector answers brings their taps back. The webhook's per-pod skips (a bad annotation, no port of that name) are
the pod author's, answered with a warning at apply: not alerted.
"""

from __future__ import annotations

from llmslo import conventions as c
from llmslo.conventions import HEALTH as H
from llmslo.durations import format_prometheus_duration
from slogen import promql
from slogen.links import DEFAULT_GRAFANA_URL, FLEET_DASHBOARD_UID, dashboard_url
from slogen.rules.alerts import literal
from slogen.rules.health import WARNING, HealthAlert, HealthOptions, _alert

TOPIC_TAP_INJECTOR = "tap_injector"


def failing_expr(opts: HealthOptions) -> str:
    failed = promql.selector(c.TAP_INJECTOR_ERRORS.name,
                             [promql.regex(c.LABEL_REASON, promql.any_of(c.TAP_INJECTOR_FAILURE_REASONS))])
    window = format_prometheus_duration(opts.tap_injector_window)
    rate = promql.agg("sum", f"rate({failed}[{window}])", (c.LABEL_CLUSTER,))
    return f"absent({c.TAP_INJECTOR_INJECTED.name})\nor\n{rate} > 0\n"


def injector_alerts(opts: HealthOptions, base_url: str, extra_labels: dict[str, str] | None = None,
                    grafana_url: str = DEFAULT_GRAFANA_URL) -> list[HealthAlert]:
    """The alert (HEALTH.TAP_INJECTOR_FAILING), none when the build does not install the injector."""
    if not opts.enabled or not opts.tap_injector:
        return []
    fleet = literal(dashboard_url(grafana_url, FLEET_DASHBOARD_UID))
    for_ = format_prometheus_duration(opts.tap_injector_for)
    reasons = ", ".join(c.TAP_INJECTOR_FAILURE_REASONS)
    return [_alert(
        H.TAP_INJECTOR_FAILING, failing_expr(opts), opts.tap_injector_for, WARNING,
        "The tap injector is not scraped, or fails the API server's reviews: new pods may start without the tap.",
        f"For {for_}, either no tap injector's counters have been scraped ({c.TAP_INJECTOR_INJECTED.name} absent), "
        f"or its reviews failed ({c.TAP_INJECTOR_ERRORS.name} with reason {reasons}). Its webhook fails open "
        "(failurePolicy Ignore), so pods created meanwhile in opted-in namespaces start without the goodput tap, "
        "and their requests are in no goodput SLI. Fix the injector (its pods, its certificate and the webhook's "
        "caBundle), then restart the pods that started without the tap.",
        TOPIC_TAP_INJECTOR,
        "The tap injector is unscraped or failing: pods may start without the goodput tap.",
        base_url, dict(extra_labels or {}), fleet)]
