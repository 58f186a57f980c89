"""SLI recording rules: `slo:sli_error:ratio_rate<W>` for every alert window and the period.

Default (traffic-weighted) mode, for event SLIs:
  * on the base window B (the page-quick short window, 5m in the 30d/28d catalogs) record the
    error and total event rates `slo:sli_errors:rate<B>` / `slo:sli_total:rate<B>` and their ratio;
  * windows up to the longest page window are ratios of the raw queries (as Sloth): paging
    needs their exact timing (a 99.9% full outage trips page-quick at 52 s);
  * longer windows (1d, 3d and the period) are sum_over_time(errors_B) / sum_over_time(total_B):
    every event is weighted once, however uneven the traffic, at the cost of reading two
    recorded series instead of every raw series over days. Within the window, each event
    weighs exactly 1 when the evaluation interval divides B; only the B-long ramps at the two
    window edges weigh events partially (see docs/slogen.md for the bound);
  * a guarded page tier's long window W (1h, 6h; tiers.guard_windows) records its error and
    total event rates too, `slo:sli_errors:rate<W>` / `slo:sli_total:rate<W>`, and its ratio from
    them: rate x W seconds is the bad events the low-traffic guard counts (a derived W records
    the errors' average base rate instead).
`--sloth-compat` emits Sloth's rules instead: raw ratios for every alert window and the
period as the average of 5m ratios (`sum_over_time(ratio) / count_over_time(ratio)`).
"""

from __future__ import annotations

from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration
from slogen import promql
from slogen.gofmt import label_filter
from slogen.loaders.common import WINDOW_TPL_RE
from slogen.model import EventsSLI, RatioSLI, RawSLI, Rule, RuleGroup
from slogen.rules.first_sample import count_first_samples
from slogen.rules.options import SLOContext
from slogen.rules.tiers import HOLD_EXPECTED_EVENTS, guard_windows, held_windows, hold_horizon

GROUP_PREFIX = "sloth-slo-sli-recordings-"
OPENSLO_RATIO_TPL = "\n  1 - (\n    (\n      {good}\n    )\n    /\n    (\n      {total}\n    )\n  )\n"

# plugins whose error query yields a series whenever the total query does
_COMPLETE_ERROR_PLUGINS = ("llmslo/latency", "llmslo/goodput", "llmslo/kv-headroom")


def render(query: str, window: int) -> str:
    return WINDOW_TPL_RE.sub(format_prometheus_duration(window), query)


def windows(ctx: SLOContext) -> list[int]:
    """Every window with a recorded error ratio: the alert windows, then the period."""
    ws = ctx.windows.windows()
    return ws + [ctx.period] if ctx.period not in ws else ws


def sli_rules(ctx: SLOContext) -> RuleGroup:
    group = RuleGroup(GROUP_PREFIX + ctx.slo.id)
    sli = ctx.slo.sli
    if isinstance(sli, EventsSLI):
        for aux in sli.aux_rules:
            group.rules.append(Rule(expr=aux.expr, record=aux.record, labels=dict(aux.labels)))
    if ctx.opts.sloth_compat or isinstance(sli, RawSLI):
        group.rules += [_sloth_rule(ctx, w) for w in windows(ctx)]
    else:
        group.rules += _traffic_weighted(ctx)
    return group


def _labels(ctx: SLOContext, window: int) -> dict[str, str]:
    return {**ctx.slo.id_labels, C.LABEL_WINDOW: format_prometheus_duration(window), **ctx.labels}


def _error_total(ctx: SLOContext) -> tuple[str, str]:
    sli = ctx.slo.sli
    if isinstance(sli, RatioSLI):
        return f"({sli.total_query})\n-\n({sli.good_query})", sli.total_query
    assert isinstance(sli, EventsSLI)
    return sli.error_query, sli.total_query


def user_written(ctx: SLOContext) -> bool:
    """Queries over the user's own counters (no plugin made them): their series may be born at a first error,
    so their first samples are counted (first_sample.py). slogen's plugins read series created at 0."""
    sli = ctx.slo.sli
    return isinstance(sli, RatioSLI) or (isinstance(sli, EventsSLI) and not sli.plugin)


def render_events(ctx: SLOContext, query: str, window: int) -> str:
    """An event query over `window`, a user-written one counting series born within it."""
    return render(count_first_samples(query, window) if user_written(ctx) else query, window)


# ---------------------------------------------------------------------------------- Sloth


def _sloth_rule(ctx: SLOContext, window: int) -> Rule:
    sli = ctx.slo.sli
    if window == ctx.period:
        return _sloth_optimized(ctx, window)
    if isinstance(sli, EventsSLI):
        expr = f"({sli.error_query})\n/\n({sli.total_query})\n"
    elif isinstance(sli, RawSLI):
        expr = f"({sli.error_ratio_query})"
    else:  # OpenSLO good/total, as Sloth maps it
        expr = "(" + OPENSLO_RATIO_TPL.format(good=sli.good_query, total=sli.total_query) + ")"
    return Rule(expr=render(expr, window), record=C.sli_error_ratio(format_prometheus_duration(window)), labels=_labels(ctx, window))


def _sloth_optimized(ctx: SLOContext, window: int) -> Rule:
    metric = C.sli_error_ratio(format_prometheus_duration(ctx.base_window))
    flt = label_filter(ctx.slo.id_labels)
    w = format_prometheus_duration(window)
    expr = (f"{promql.over_time('sum', metric + flt, w)}\n/ {promql.ignoring((C.LABEL_WINDOW,))}\n"
            f"{promql.over_time('count', metric + flt, w)}\n")
    return Rule(expr=expr, record=C.sli_error_ratio(w), labels=_labels(ctx, window))


# ---------------------------------------------------------------------- traffic-weighted


def _traffic_weighted(ctx: SLOContext) -> list[Rule]:
    base = ctx.base_window
    b = format_prometheus_duration(base)
    flt = label_filter(ctx.slo.id_labels)
    err_q, tot_q = _error_total(ctx)
    err_b, tot_b = render_events(ctx, err_q, base), render_events(ctx, tot_q, base)
    sli = ctx.slo.sli
    complete = isinstance(sli, EventsSLI) and sli.plugin in _COMPLETE_ERROR_PLUGINS
    # A missing error series means no errors, so record 0 rather than nothing (the ratios stay defined).
    errors_expr = f"{err_b}\n" if complete else f"({err_b})\nor\n0 * ({tot_b})\n"
    errors, total = C.sli_errors_rate(b), C.sli_total_rate(b)
    rules = [
        Rule(expr=errors_expr, record=errors, labels=_labels(ctx, base)),
        Rule(expr=f"{tot_b}\n", record=total, labels=_labels(ctx, base)),
        Rule(expr=f"{errors}{flt}\n/\n{total}{flt}\n", record=C.sli_error_ratio(b), labels=_labels(ctx, base)),
    ]
    guarded = set(guard_windows(ctx))
    for window in windows(ctx):
        if window == base:
            continue
        w = format_prometheus_duration(window)
        labels = _labels(ctx, window)
        if window <= ctx.derive_above and window in guarded:
            # A guarded page window records its event rates as the base window does: the low-traffic
            # guard counts the errors (rate x seconds), the ratio divides the two (no query runs twice).
            errors_w, total_w = C.sli_errors_rate(w), C.sli_total_rate(w)
            rules += [Rule(expr=render_events(ctx, f"{err_q}\n" if complete else f"({err_q})\nor\n0 * ({tot_q})\n",
                                              window), record=errors_w, labels=labels),
                      Rule(expr=render_events(ctx, f"{tot_q}\n", window), record=total_w, labels=dict(labels))]
            expr = f"{errors_w}{flt}\n/\n{total_w}{flt}\n"
        elif window <= ctx.derive_above:
            err_w = err_q if complete else f"({err_q})\nor\n0 * ({tot_q})"  # as the base window: no errors is 0
            expr = render_events(ctx, f"({err_w})\n/\n({tot_q})\n", window)
        else:
            if window in guarded:  # the guard's count from the base rate: avg over the window, x its seconds
                rules.append(Rule(expr=f"{promql.over_time('avg', errors + flt, w)}\n", record=C.sli_errors_rate(w),
                                  labels=labels))
                # and its traffic, which the short window's hold reads (alerts._burn)
                rules.append(Rule(expr=f"{promql.over_time('avg', total + flt, w)}\n", record=C.sli_total_rate(w),
                                  labels=dict(labels)))
            expr = f"{promql.over_time('sum', errors + flt, w)}\n/\n{promql.over_time('sum', total + flt, w)}\n"
        rules.append(Rule(expr=expr, record=C.sli_error_ratio(w), labels=dict(labels)))
    # A page tier's short window, where it had traffic: NaN (0/0, no requests) is dropped, so that
    # last_over_time() over it is the last measured verdict (alerts._burn holds it while no request comes).
    for window in held_windows(ctx):
        w = format_prometheus_duration(window)
        rules.append(Rule(expr=f"{C.sli_error_ratio(w)}{flt} >= 0\n", record=C.sli_error_measured(w),
                          labels=_labels(ctx, window)))
        rules.append(Rule(expr=f"timestamp({C.sli_error_ratio(w)}{flt} >= 0)\n", record=C.sli_error_measured_at(w),
                          labels=_labels(ctx, window)))
        rules.append(_held(ctx, window))
    return rules


def _held(ctx: SLOContext, short: int) -> Rule:
    """The short window's verdict a page tier reads (alerts._burn): the last measured ratio within the long window,
    while the window is measured now or the silence since is one in which the long window's traffic expected fewer
    than HOLD_EXPECTED_EVENTS requests. Recorded here, after the series it reads, because rules of one group are
    evaluated in order at one time (the alert group may run before this one: its `time()` would see a silence of
    one evaluation, which at high traffic ends every hold)."""
    flt = label_filter(ctx.slo.id_labels)
    s, lw = format_prometheus_duration(short), format_prometheus_duration(hold_horizon(ctx, short))
    measured = f"{C.sli_error_measured(s)}{flt}"
    since = f"time() - {promql.over_time('last', C.sli_error_measured_at(s) + flt, lw)}"
    # `* ignoring (sloth_window)` drops that label from its result, so the `and` ignores it too
    expr = (f"{promql.over_time('last', measured, lw)}\nand {promql.ignoring((C.LABEL_WINDOW,))}\n({measured}\nor\n"
            f"({since}) * {promql.ignoring((C.LABEL_WINDOW,))} {C.sli_total_rate(lw)}{flt} < {HOLD_EXPECTED_EVENTS})\n")
    return Rule(expr=expr, record=C.sli_error_held(s), labels=_labels(ctx, short))

