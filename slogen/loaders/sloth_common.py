"""Inline `events:` equivalents of Sloth's sloth-common SLI plugins (github.com/slok/sloth-common-sli-plugins).

slogen does not load Go plugins; when a spec names one of these, the error's fix is the SLI written
out, with the plugin's `filter` option already applied, so the user pastes it instead. Each entry
says which metric the plugin reads and which series count as errors (taken from the plugin's query).
"""

from __future__ import annotations

W = "{{.window}}"

# plugin id -> (error selector metric, error matchers, total metric, shape)
#   shape "rate": sum(rate(metric{...}[W])); "up": count_over_time over a subquery of `up`
_KNOWN: dict[str, tuple[str, str, str, str]] = {
    "sloth-common/kubernetes/apiserver/availability": ("apiserver_request_total", 'code=~"(5..|429)"',
                                                       "apiserver_request_total", "rate"),
    "sloth-common/prometheus/rules/evalavailability": ("prometheus_rule_evaluation_failures_total", "",
                                                       "prometheus_rule_evaluations_total", "rate"),
    "sloth-common/prometheus/targets/availability": ("up", "", "up", "up"),
}


def _sel(metric: str, *matchers: str) -> str:
    inner = ",".join(m for m in matchers if m)
    return f"{metric}{{{inner}}}"


def events_equivalent(plugin_id: str, options: dict[str, str], error_key: str, total_key: str) -> str:
    """`sli: {events: {...}}` for a known sloth-common plugin, as one flow-style line; "" when unknown."""
    known = _KNOWN.get(plugin_id)
    if known is None:
        return ""
    err_metric, err_match, tot_metric, shape = known
    flt = options.get("filter", "").strip().strip("{},")
    if shape == "up":
        err = f"sum(count_over_time(({_sel(err_metric, flt)} == 0)[{W}:]))"
        tot = f"sum(count_over_time({_sel(tot_metric, flt)}[{W}:]))"
    else:
        err = f"sum(rate({_sel(err_metric, flt, err_match)}[{W}]))"
        tot = f"sum(rate({_sel(tot_metric, flt)}[{W}]))"
    return f"sli: {{events: {{{error_key}: '{err}', {total_key}: '{tot}'}}}}"
