"""Run-time guard for engine-sourced latency SLIs: an alert where series lack the threshold's bucket.

slogen refuses, at build time, an engine-sourced `llmslo/latency` threshold that is not a bucket edge
of every engine kind and version in llmslo/bucket_edges.py. That table cannot know an engine started
with other buckets (vLLM, SGLang, Triton and trtllm-serve let operators change them), a version it
does not list, or an engine kind outside the selector's reach. Where such an engine runs, its
histogram has a `_count` but no `_bucket` at the threshold, and the SLI goes wrong without a sound:
a cluster where no engine has the edge has no error ratio (`count - bucket` is empty), so neither
its burn alerts nor the per-cluster no-data arm (it watches the recorded total, which is there)
fire, and `absent()` over the bucket is fleet-wide; a cluster where only some engines lack it counts
all their requests as too slow.

So, per SLO, one alert `<alerting name>ThresholdNotABucketEdge`:

    count by (<the SLI's by labels>, engine) (
      <the SLI's count selector>
      unless ignoring (le)
      <the SLI's bucket selector at the threshold>
    )

Series by series, every `_count` the SLI reads without the bucket at its threshold, counted per
cluster and engine kind: the alert names where, and which kind. It is a ticket (severity warning,
`slo_tier="bucket-edge"`), as the no-data alert: nothing is failing for users because of it, but
the SLO cannot protect them there until the threshold or the engines' buckets change, which is a
day-time fix (a wrong threshold does not get better at 3 a.m.).

Its own rule group (`llmslo-bucket-edges-<slo id>`) keeps it apart from the burn-rate alert group
and its tests; `generate_slo` adds the group, `service_tests` adds `bucket_edge_tests`, and the
runbook comes from runbook_bucket_edge.md.j2 with `runbook_details`.
"""

from __future__ import annotations

from llmslo import bucket_edges as be
from llmslo import conventions as c
from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration
from llmslo.engine_thresholds import engine_kinds
from llmslo.sli_plugins import LatencyParams
from slogen import promql
from slogen.model import EventsSLI, Rule, RuleGroup
from slogen.plugins.llm import engine_latency_selectors, le_label
from slogen.rules.alerts import SEVERITY, rendered, runbook_url, slo_dashboard_link
from slogen.rules.options import SLOContext
from slogen.rules.scope import fired_labels

GROUP_PREFIX = "llmslo-bucket-edges-"
ALERT_SUFFIX = "ThresholdNotABucketEdge"
TIER = "bucket-edge"  # the slo_tier label value, as "no-data" for the no-data alert


def alert_name(alerting_name: str) -> str:
    return alerting_name + ALERT_SUFFIX


def group_name(slo_id: str) -> str:
    return GROUP_PREFIX + slo_id


def scope(sli: EventsSLI) -> tuple[str, ...]:
    """The labels the alert is per: the SLI's `by` (cluster by default) and the engine kind."""
    return tuple(dict.fromkeys((*sli.by, c.LABEL_ENGINE)))


def expression(count_sel: str, bucket_sel: str, labels: tuple[str, ...]) -> str:
    return promql.agg("count", f"\n  {count_sel}\n  unless {promql.ignoring((c.LABEL_LE,))}\n  {bucket_sel}\n", labels) + "\n"


def _l(label: str) -> str:
    return f"{{{{ $labels.{label} }}}}"


def _where(labels: tuple[str, ...]) -> str:
    return ", ".join(f"{label} {_l(label)}" for label in labels if label != c.LABEL_ENGINE)


def _params(sli: EventsSLI) -> LatencyParams:
    """The resolved parameters of an engine-sourced latency SLI (engine_latency_selectors chose it)."""
    assert isinstance(sli.params, LatencyParams)
    return sli.params


def _metric(sli: EventsSLI) -> str:
    return _params(sli).metric


def bucket_edge_groups(ctx: SLOContext) -> list[RuleGroup]:
    """The alert's group for an engine-sourced latency SLO with alerts; none for any other SLO,
    with alerts disabled, or in `--sloth-compat` (Sloth's rules exactly)."""
    sli = ctx.slo.sli
    if ctx.opts.sloth_compat or not ctx.alerts_enabled or not isinstance(sli, EventsSLI):
        return []
    selectors = engine_latency_selectors(sli)
    if selectors is None:
        return []
    return [RuleGroup(group_name(ctx.slo.id), [_alert(ctx, sli, selectors[0], selectors[1])])]


def _alert(ctx: SLOContext, sli: EventsSLI, count_sel: str, bucket_sel: str) -> Rule:
    slo = ctx.slo
    a = slo.alerting
    meta = a.ticket if not a.ticket.disable else a.page
    name = alert_name(a.name or meta.name)
    labels = scope(sli)
    threshold = sli.plugin_options.get("threshold", "")
    written = sli.plugin_options.get("threshold_as_written")
    metric = _metric(sli)
    rounded = (f" (the spec wrote {written} s; threshold_rounding: {sli.plugin_options.get('threshold_rounding')} "
               f"chose {threshold} s, an edge of every engine version slogen knows)") if written else ""
    where = _where(labels)
    at = f" in {where}" if where else ""
    by = ", ".join(sli.by) or "group"
    wait = 2 * ctx.base_window
    description = (
        f"{{{{ $value }}}} {metric} histogram series of {_l(c.LABEL_ENGINE)} engines{at} carry the SLI's total "
        f"({count_sel}) but no bucket at its threshold {threshold} s{rounded} ({bucket_sel}): those engines' "
        f"buckets do not include it (a version or a bucket configuration llmslo/bucket_edges.py does not list). "
        f"Where a whole {by} lacks the edge, the SLI has no error ratio there and its burn-rate and no-data alerts "
        f"cannot fire; where only some engines lack it, all their requests count as too slow. Measure at an edge "
        f"these engines have, select only the engines that have it, or give them the edge.")
    return Rule(
        expr=expression(count_sel, bucket_sel, labels),
        alert=name,
        for_=format_prometheus_duration(wait),
        labels={C.LABEL_ALERT_SEVERITY: SEVERITY["ticket"], **meta.labels, **slo.id_labels,
                C.LABEL_SEVERITY: "ticket", C.LABEL_TIER: TIER},
        annotations={
            "summary": (f"{slo.service} {slo.name}: {threshold} s is not a {metric} bucket edge of the "
                        f"{_l(c.LABEL_ENGINE)} engines{at}, so the SLI cannot measure them."),
            "description": description,
            "runbook_url": runbook_url(name, ctx.opts.runbook_base_url, ctx.slo.service),
            "dashboard": slo_dashboard_link(ctx),
        },
    )


def expand(template: str, labels: dict[str, str], value: str) -> str:
    """The annotation as Prometheus renders it for one alert (only the references this module writes)."""
    out = template.replace("{{ $value }}", value)
    for label, text in labels.items():
        out = out.replace(_l(label), text)
    return out


# ------------------------------------------------------------------------------ promtool tests


def bucket_edge_tests(r, step: int) -> list[dict]:
    """Tests for the alert of one `SLOResult`: clusters report the SLI's histogram, one with the
    threshold's bucket, one without (another edge instead) and one where one engine has it and
    another does not: it fires for the second and third only, after its `for` (a comparison of
    whole clusters would miss the third, whose SLI counts every request of that engine as too slow);
    and with the edge everywhere, it never fires. Empty when there is no such alert or the plugin
    could not synthesize its series."""
    sli = r.slo.sli
    group = next((g for g in r.rules.groups() if g.name == group_name(r.slo.id)), None)
    if group is None or not isinstance(sli, EventsSLI):
        return []
    rule = group.rules[0]
    total = next((f for f in sli.fixtures if f.role == "total"), None)
    good = next((f for f in sli.fixtures if f.role == "good"), None)
    selectors = engine_latency_selectors(sli)
    if total is None or good is None or selectors is None:
        return []
    p = _params(sli)
    metric = p.metric
    row = next(iter(be.rows(engine_kinds(p.selection.matchers), metric)), None)
    if row is None:
        return []
    threshold = p.threshold
    lo, hi = be.nearest(row.edges[metric], threshold)
    other = lo if lo is not None else hi if hi is not None else threshold / 2
    base = {**total.labels, c.LABEL_ENGINE: row.kind}
    split = sli.by[0] if sli.by else ""
    wait = -(-2 * r.ctx.base_window // step)  # the alert's `for`, in steps
    n = wait + 4

    def series(where: str, le: str, **extra: str) -> list[dict]:
        labels = {**base, split: where, **extra} if split else {**base, **extra}
        count = {"series": _sel(total.name, labels), "values": f"0+10x{n}"}
        return [count] + [{"series": _sel(good.name, {**labels, c.LABEL_LE: x}), "values": f"0+{k}x{n}"}
                          for k, x in ((5, le), (10, "+Inf"))]

    with_edge, without = le_label(threshold), le_label(other)
    mixed = bool(split) and c.LABEL_POD not in base and split != c.LABEL_POD

    def expected(where: str) -> dict:
        fired = {k: v for k, v in base.items() if k in scope(sli)}
        if split:
            fired[split] = where
        return {"exp_labels": fired_labels(fired, rule),
                "exp_annotations": {k: rendered(expand(v, fired, "1")) for k, v in sorted(rule.annotations.items())}}

    staged = (series("with-edge", with_edge) if split else []) + series("without-edge", without)
    firing = [expected("without-edge")]
    name = (f"one {split} with the bucket le={with_edge}, one without (le={without} instead)" if split
            else f"an engine without the bucket le={with_edge} (le={without} instead)")
    if mixed:
        staged += series("mixed", with_edge, pod="has-edge") + series("mixed", without, pod="lacks-edge")
        firing.append(expected("mixed"))
        name += f" and one where one engine has it and another does not: {rule.alert} fires for the last two"
    else:
        name += f": {rule.alert} fires for the one without"
    lost = _lost_edge_tests(r, rule, base, split, threshold, with_edge, without, expected, step) if mixed else []
    return [
        {"name": f"{r.slo.id}: {name}, after {rule.for_}",
         "interval": format_prometheus_duration(step),
         "input_series": staged,
         "alert_rule_test": [
             {"eval_time": format_prometheus_duration((wait - 1) * step), "alertname": rule.alert, "exp_alerts": []},
             {"eval_time": format_prometheus_duration((wait + 1) * step), "alertname": rule.alert,
              "exp_alerts": sorted(firing, key=lambda e: sorted(e["exp_labels"].items()))}]},
        {"name": f"{r.slo.id}: every {split or 'engine'} has the bucket le={with_edge}: {rule.alert} stays quiet",
         "interval": format_prometheus_duration(step),
         "input_series": series("with-edge", with_edge) + (series("also-with-edge", with_edge) if split else []),
         "alert_rule_test": [
             {"eval_time": format_prometheus_duration((wait + 1) * step), "alertname": rule.alert, "exp_alerts": []}]},
    ] + lost


def _lost_edge_tests(r, rule: Rule, base: dict[str, str], split: str, threshold: float, with_edge: str,
                     without: str, expected, step: int) -> list[dict]:
    """An engine upgrade whose buckets lack the threshold's edge, in one `split` (a cluster): the new pods'
    requests cannot be measured against the threshold, so they are neither good nor bad (plugins/llm.py:
    `measurable`) and the bucket-edge alert is the one signal.

    * Healthy: an old pod (with the edge) and a new one (without it) each serve 10 requests a step, all
      faster than the threshold. Counting the new pod's requests as too slow would make the error ratio
      10 / 20 = 0.5, far above every tier's threshold: the SLO's alert would page. It must stay quiet while
      the bucket-edge alert fires for the cluster after its `for`.
    * Hurt: every request is slower than the threshold; the old pod (with the edge) serves 10 a step for 2h
      and stops, the new pod (without it) serves 10 a step for the next 2h. Every measured request was too
      slow, so the error ratio of the derived windows (sum_over_time of the base-window rates) stays 1 at
      the end; counting the new pod's requests in the total only would halve it (10 x 24 / (10 x 48))."""
    sli = r.slo.sli
    burn = next((x for x in r.rules.alerts.rules if x.labels.get(C.LABEL_TIER) not in (None, "no-data")), None)
    ctx = r.ctx
    derived = [w for w in (*ctx.windows.windows(), ctx.period) if w > ctx.derive_above]
    if burn is None or not derived:
        return []
    wait = -(-2 * ctx.base_window // step)
    n = wait + 4
    where = "upgrading"

    def histogram(pod: str, le: str, fast: int, start: int, length: int) -> list[dict]:
        """10 requests a step from `start` for `length` steps, `fast` of them within the threshold."""
        labels = {**base, split: where, c.LABEL_POD: pod}
        blanks = f"_x{start} " if start else ""
        count = next(f.name for f in sli.fixtures if f.role == "total")
        bucket = next(f.name for f in sli.fixtures if f.role == "good")
        return [{"series": _sel(count, labels), "values": f"{blanks}0+10x{length}"}] + [
            {"series": _sel(bucket, {**labels, c.LABEL_LE: x}), "values": f"{blanks}0+{k}x{length}"}
            for x, k in ((le, fast), ("+Inf", 10))]

    healthy = histogram("old", with_edge, 10, 0, n) + histogram("new", without, 10, 0, n)
    hours = max(1, -(-2 * 3_600_000 // step))  # 2h, in steps
    hurt = histogram("old", with_edge, 0, 0, hours) + histogram("new", without, 0, hours, hours)
    window = format_prometheus_duration(derived[0])
    ratio = {"__name__": C.sli_error_ratio(window), **r.slo.id_labels, C.LABEL_WINDOW: window, **ctx.labels,
             split: where}
    return [
        {"name": (f"{r.slo.id}: a healthy {split} upgrades half its engines to buckets without le={with_edge}: "
                  f"their requests are neither good nor bad (else the error ratio is 10 / 20 = 0.5 and it pages), "
                  f"so {burn.alert} stays quiet and {rule.alert} fires, after {rule.for_}"),
         "interval": format_prometheus_duration(step),
         "input_series": healthy,
         "alert_rule_test": [
             {"eval_time": format_prometheus_duration(k * step), "alertname": burn.alert, "exp_alerts": []}
             for k in (2, wait + 1, n)] + [
             {"eval_time": format_prometheus_duration((wait + 1) * step), "alertname": rule.alert,
              "exp_alerts": [expected(where)]}]},
        {"name": (f"{r.slo.id}: every request too slow; the engine with le={with_edge} serves 2h and the one "
                  f"without it the next 2h: the {window} error ratio of the measured requests stays 1 "
                  f"(counting the unmeasured ones in the total would make it 10 x {hours} / (10 x {2 * hours}) = 0.5)"),
         "interval": format_prometheus_duration(step),
         "input_series": hurt,
         "promql_expr_test": [
             {"expr": _sel(ratio["__name__"], {k: v for k, v in ratio.items() if k != "__name__"}),
              "eval_time": format_prometheus_duration(2 * hours * step),
              "exp_samples": [{"labels": _sel(ratio["__name__"], {k: v for k, v in ratio.items() if k != "__name__"}),
                               "value": 1}]}]},
    ]


def _sel(name: str, labels: dict[str, str]) -> str:
    return f"{name}{{{','.join(f'{k}={_q(v)}' for k, v in sorted(labels.items()))}}}"


def _q(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ------------------------------------------------------------------------------ runbook


def runbook_details(metric: str, threshold: str, count_sel: str, bucket_sel: str, bucket_any_sel: str,
                    labels: tuple[str, ...], kinds: tuple[str, ...], written: str = "", rounding: str = "") -> dict:
    """What the bucket-edge runbook shows: its queries, and the table's edges for the selected engines."""
    per_pod = tuple(dict.fromkeys((*labels, c.LABEL_NAMESPACE, c.LABEL_POD)))
    rows = [{"engine": r.label, "edges": ", ".join(be.edge_text(e) for e in r.edges[metric]) or "none (+Inf only)",
             "has_threshold": r.has_edge(metric, float(threshold)), "source": r.source,
             "configurable": r.configurable or "no"}
            for r in be.rows(kinds, metric)]
    return {
        "metric": metric,
        "threshold": threshold,
        "written": written,
        "rounding": rounding,
        "missing": promql.agg("count", f"{count_sel} unless {promql.ignoring((c.LABEL_LE,))} {bucket_sel}", per_pod),
        "edges_present": promql.agg("count", bucket_any_sel, (*labels, c.LABEL_LE)),
        "with_edge": promql.agg("count", bucket_sel, labels),
        "rows": rows,
    }


def runbook_details_for(ctx: SLOContext) -> dict:
    """`runbook_details` of one resolved SLO (its SLI must be an engine-sourced latency SLI)."""
    sli = ctx.slo.sli
    selectors = engine_latency_selectors(sli) if isinstance(sli, EventsSLI) else None
    if not isinstance(sli, EventsSLI) or selectors is None:
        raise TypeError(f"SLO {ctx.slo.id}: runbook details are for engine-sourced latency SLIs")
    count_sel, bucket_sel, bucket_any = selectors
    p = _params(sli)
    o = sli.plugin_options  # the spec's own spelling of the threshold, for the runbook's text
    return runbook_details(p.metric, o.get("threshold", ""), count_sel, bucket_sel, bucket_any, scope(sli),
                           engine_kinds(p.selection.matchers), o.get("threshold_as_written", ""), p.rounding)


__all__ = ["ALERT_SUFFIX", "GROUP_PREFIX", "TIER", "alert_name", "bucket_edge_groups",
           "bucket_edge_tests", "expression", "runbook_details", "runbook_details_for"]
