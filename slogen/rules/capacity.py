"""Capacity: KV seats per engine and per pool, a time-to-exhaustion forecast, and two alerts on them.

Why: KV-cache usage says how full an engine is, not how many more requests it can take. A seat is
room for one more request: free KV tokens (free blocks x block size) net of what the engine's requests
will still take, divided by a request's token footprint (prompt + output), at the p99 and the p50 request
size the engine itself observed (`llm_request_prompt_tokens` / `llm_request_generation_tokens`).

What the requests will still take (committed) is not on any engine's page; it is approximated from what is:
each running request x the p50 output (a running request has produced part of its output, but one picked
at random is longer than the median: the two roughly cancel for the usual spreads), plus each waiting
request x the p50 request (its prompt and output both still to come). An approximation that errs towards
fewer free tokens when outputs are short-tailed; the tap's gate (exporter/tap/seats.py) sees each request
and does better. Engines without those histograms (trtllm-serve) get no seats and no committed tokens: their
net free tokens are their free tokens. A pool is the replicas of one model in one namespace (and cluster):
its seats are the sum of its engines' seats.

Two alerts, in the severities' usual sense: a ticket when a pool stays under N seats at p99 context
(someone should add replicas this week), and a page when the pool's free KV tokens are forecast to run
out within M minutes, or have run out while its queue grows (users are waiting). A pool that is full but
stable (seats low, free tokens not falling, queue not growing) gets the ticket, never the page.

Why the page has two arms: vLLM (and SGLang) queue only once the KV cache is full, so a forecast that
also needs a growing queue comes after exhaustion; and once the cache is full, raw free tokens sit at ~0
and their trend goes flat. So: the forecast on net free tokens (free less committed: it pages before the
queue exists, earlier than raw free tokens would by what the running requests will still take, and it
keeps falling while the queue grows, since each waiting request commits a p50 request), or "under one p99
seat left and the queue growing" (it holds the page however the trend looks). The forecast uses tokens,
not seats, so that a change in the request-size footprint does not read as a trend.

Why the forecast tells a wave from a trend: load that comes in waves (an hourly batch job) makes free tokens
fall steeply on every wave and come back after it. A 10-minute trend reads each fall as a run to exhaustion:
it paged every hour while the wave's bottom still held 14-16 p99 seats. A pool that runs out goes lower than
it has been; a wave goes back to about where the last one went. So the forecast exists only while the pool's
net free tokens are under their lowest over the last wave period (`wave_period`, 1h) as of a trend window
ago: while the pool still holds the p99 seats it held at the bottom of the last wave (and got back), a fall is
a wave; under that, it is a trend. A steady fill is under everything before it, so it pages as early as
before; the window ends T ago, so T minutes of the fall are the margin a noisy fill has to stay under it.
Rejected: a longer deriv window (or one that must agree with the short one) lags a fill that began less
than a window ago, so the page comes late; "lower than at the same point an hour ago" pages on a wave that
comes a few minutes early; a floor of seats cannot tell a fast fill 9 minutes from empty (18 seats) from a
wave's bottom (15 seats). Limits: in a pool's first wave period there is no earlier bottom, and it pages as
before; a fill that retraces the last wave is a trend only once under that wave's bottom; and a trend that
deepens each wave's bottom by less than `for` minutes of the wave's fall pages only once a wave runs out.

Own rule group and file (`llmslo-capacity`), the same labels and annotations as the health alerts
(`severity`, `summary`, `description`, `runbook_url`, `dashboard`). Plain PromQL only.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmslo import conventions as c
from llmslo.conventions import CAPACITY as K
from llmslo.durations import MINUTE, format_prometheus_duration
from llmslo.gofloat import go_g
from slogen import promql
from slogen.links import DEFAULT_GRAFANA_URL, FLEET_DASHBOARD_UID, dashboard_url
from slogen.model import Rule, RuleGroup
from slogen.rules import knobs
from slogen.rules.alerts import literal
from slogen.rules.health import CRITICAL, TOPIC_KV_SATURATION, WARNING, HealthAlert, _alert, _l
from slogen.rules.knobs import knob

EXHAUSTION_LEAD = 5 * MINUTE  # the page fires at least this long before a steadily filling pool runs out


@dataclass(frozen=True)
class CapacityOptions:
    """`slogen build --capacity-... ` options; durations in ms."""

    enabled: bool = True
    footprint_window: int = knob(30 * MINUTE, "WINDOW", "", "the rate window of the request-size histograms behind "
                                 "the p99 and p50 per-request footprints")
    trend_window: int = knob(10 * MINUTE, "WINDOW", "", "the deriv() window of the time-to-exhaustion forecast and "
                             "of the queue trend")
    seats_low: float = knob(4.0, "SEATS", "LLMKVSeatsLow (ticket)", "a pool under this many seats (requests "
                            "of p99 size, at p99 context, its free KV tokens hold) for seats_low_for",
                            accepts="a positive number of seats, e.g. 4")
    seats_low_for: int = knob(15 * MINUTE, "DURATION", "LLMKVSeatsLow", "how long before it fires")
    exhaustion_minutes: float = knob(15.0, "MINUTES", "LLMKVSeatsExhaustion (page)",
                                     "free KV tokens forecast to run out within this many minutes (or already "
                                     "out with the queue growing), for exhaustion_for; the page comes at least 5 "
                                     "minutes before the pool runs out",
                                     accepts="a positive number of minutes, e.g. 15")
    exhaustion_for: int = knob(5 * MINUTE, "DURATION", "LLMKVSeatsExhaustion", "how long before it fires")
    wave_period: int = knob(60 * MINUTE, "WINDOW", "LLMKVSeatsExhaustion",
                            "the forecast holds only while the pool's free tokens are under their lowest over this "
                            "long, as of a trend window ago, so a load wave (an hourly batch job) that falls no lower "
                            "than the last one did does not page")

    def problems(self) -> list[tuple[str, str]]:
        out = knobs.problems(self, "capacity_")
        # A steady fall is first forecast under M minutes with under M left, and the page fires `for` later:
        # the warning it gives is M - 1m (one evaluation step) - for, which must leave the promised 5 minutes.
        if 0 < self.exhaustion_minutes and 0 < self.exhaustion_for and \
                self.exhaustion_for + EXHAUSTION_LEAD + MINUTE > self.exhaustion_minutes * MINUTE:
            out.append(("capacity_exhaustion_for",
                        f"is {format_prometheus_duration(self.exhaustion_for)}, not 6m shorter than the forecast horizon "
                        f"({self.exhaustion_minutes:g} minutes), so the page would fire less than 5 minutes before the "
                        "pool runs out; write a shorter duration or a longer --capacity-exhaustion-minutes"))
        out += self._wave_problems()
        return out

    def _wave_problems(self) -> list[tuple[str, str]]:
        """A wave the forecast could page on falls for the trend window and `for` (and the step between), and
        the last one's bottom must lie in the wave period that ends a trend window ago: shorter guards nothing."""
        least = 2 * self.trend_window + self.exhaustion_for + MINUTE
        if self.wave_period <= 0 or self.wave_period % MINUTE or self.wave_period >= least:
            return []
        return [("capacity_wave_period",
                 f"is {format_prometheus_duration(self.wave_period)}, shorter than twice the trend window + "
                 f"--capacity-exhaustion-for + 1m ({format_prometheus_duration(least)}): no wave the forecast could "
                 "page on is that short; write the period of the pool's load waves, e.g. 1h")]


def footprint_expr(q: float, window: str) -> str:
    """The q-quantile request footprint in tokens: quantile of prompt tokens + quantile of output tokens.
    A sum of quantiles is at least the quantile of the sum for positively related sizes: an upper-bound-ish
    footprint, so seats err low. `> 0` drops engines that finished no request in the window (NaN)."""
    parts = [f"histogram_quantile({go_g(q)}, {promql.agg('sum', promql.rate(m.bucket(), window), (c.LABEL_LE, *K.ENGINE_LABELS))})"
             for m in (c.REQUEST_PROMPT_TOKENS, c.REQUEST_GENERATION_TOKENS)]
    return f"(\n  {parts[0]}\n+\n  {parts[1]}\n) > 0\n"


def committed_expr(window: str) -> str:
    """Running requests x the p50 output, plus waiting requests x the p50 request (see the module's docstring)."""
    engine, on = K.ENGINE_LABELS, promql.on(K.ENGINE_LABELS)
    # `>= 0` drops an engine that finished no request in the window (NaN): no committed tokens, its net is its free
    p50_out = (f"(histogram_quantile(0.5, "
               f"{promql.agg('sum', promql.rate(c.REQUEST_GENERATION_TOKENS.bucket(), window), (c.LABEL_LE, *engine))}) >= 0)")
    return (f"{promql.agg('sum', c.REQUESTS_RUNNING.name, engine)}\n  * {on}\n  {p50_out}\n"
            f"+ {on}\n  {promql.agg('sum', c.REQUESTS_WAITING.name, engine)}\n  * {on}\n  {K.FOOTPRINT_P50}\n")


def recording_rules(opts: CapacityOptions) -> list[Rule]:
    engine, pool = K.ENGINE_LABELS, K.POOL_LABELS
    window = format_prometheus_duration(opts.footprint_window)
    net = f"clamp_min({K.FREE_TOKENS_NET}, 0)"  # seats are never negative; the net itself is, once overcommitted
    return [
        Rule(record=K.FREE_TOKENS,
             expr=f"{promql.agg('sum', c.KV_BLOCKS_FREE.name, engine)}\n* {promql.on(engine)}\n"
                  f"{promql.agg('max', c.KV_BLOCK_SIZE.name, engine)}\n"),
        Rule(record=K.FOOTPRINT_P99, expr=footprint_expr(0.99, window)),
        Rule(record=K.FOOTPRINT_P50, expr=footprint_expr(0.5, window)),
        Rule(record=K.COMMITTED_TOKENS, expr=committed_expr(window)),
        Rule(record=K.FREE_TOKENS_NET,
             expr=f"{K.FREE_TOKENS} - {promql.on(engine)} {K.COMMITTED_TOKENS}\nor\n{K.FREE_TOKENS}\n"),
        Rule(record=K.SEATS_P99, expr=f"{net} / {K.FOOTPRINT_P99}\n"),
        Rule(record=K.SEATS_P50, expr=f"{net} / {K.FOOTPRINT_P50}\n"),
        Rule(record=K.POOL_SEATS_P99, expr=promql.agg("sum", K.SEATS_P99, pool) + "\n"),
        Rule(record=K.POOL_SEATS_P50, expr=promql.agg("sum", K.SEATS_P50, pool) + "\n"),
        Rule(record=K.POOL_WAITING, expr=promql.agg("sum", c.REQUESTS_WAITING.name, pool) + "\n"),
        Rule(record=K.POOL_FREE_TOKENS, expr=promql.agg("sum", K.FREE_TOKENS, pool) + "\n"),
        Rule(record=K.POOL_FREE_TOKENS_NET, expr=promql.agg("sum", K.FREE_TOKENS_NET, pool) + "\n"),
        Rule(record=K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION, expr=forecast_expr(opts)),
    ]


def forecast_expr(opts: CapacityOptions) -> str:
    """Net free tokens / (tokens lost per minute), only where they fall (absent when flat or rising; 0 once out)
    and are under their lowest over the wave period before the trend window (absent in a wave: module docstring)."""
    net, trend = K.POOL_FREE_TOKENS_NET, format_prometheus_duration(opts.trend_window)
    lowest = promql.over_time("min", net, format_prometheus_duration(opts.wave_period), offset=trend)
    return (f"(\n  clamp_min({net}, 0)\n/\n  ({promql.deriv(net, trend)} * -60 > 0)\n)\n"
            f"unless {promql.on(K.POOL_LABELS)}\n(\n  {net} >= {promql.on(K.POOL_LABELS)} {lowest}\n)\n")


def page_expr(opts: CapacityOptions) -> str:
    """Forecast on free tokens, or exhausted (under one p99 seat) with a growing queue; both keep the pool labels,
    so the alert stays one alert when one arm hands over to the other."""
    on_pool, trend = promql.on(K.POOL_LABELS), format_prometheus_duration(opts.trend_window)
    return (f"{K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION} < {go_g(opts.exhaustion_minutes)}\n"
            f"or {on_pool}\n(\n"
            f"  {K.POOL_SEATS_P99} < 1\n"
            f"  and {on_pool}\n  {K.POOL_WAITING} > 0\n"
            f"  and {on_pool}\n  {promql.deriv(K.POOL_WAITING, trend)} > 0\n)\n")


def capacity_alerts(opts: CapacityOptions, base_url: str, extra_labels: dict[str, str] | None = None,
                    grafana_url: str = DEFAULT_GRAFANA_URL) -> list[HealthAlert]:
    extra = dict(extra_labels or {})
    fleet = literal(dashboard_url(grafana_url, FLEET_DASHBOARD_UID))
    pool = f"Pool {_l(c.LABEL_NAMESPACE)}/{_l(c.LABEL_MODEL)}"
    n, m = go_g(opts.seats_low), go_g(opts.exhaustion_minutes)
    low_for, trend = format_prometheus_duration(opts.seats_low_for), format_prometheus_duration(opts.trend_window)
    wave = format_prometheus_duration(opts.wave_period)
    return [
        _alert(K.SEATS_LOW, f"{K.POOL_SEATS_P99} < {n}\n", opts.seats_low_for, WARNING,
               f"{pool} has fewer than {n} KV seats at p99 context.",
               f"For {low_for} the pool's free KV cache has held fewer than {n} more requests of p99 size "
               f"({K.POOL_SEATS_P99}). It is healthy while nothing queues, but the next burst will queue (TTFT rises) "
               "or preempt. Plan replicas or more KV blocks per replica (docs/metrics.md, \"KV seats\").",
               TOPIC_KV_SATURATION,
               f"A pool has had fewer than {n} KV seats at p99 context for {low_for}: little room for the next burst.",
               base_url, extra, fleet, group=K.GROUP),
        _alert(K.SEATS_EXHAUSTION, page_expr(opts), opts.exhaustion_for, CRITICAL,
               f"{pool} runs out of KV cache within {m} minutes, or has run out while its queue grows.",
               f"At the trend of the last {trend}, the pool's free KV tokens net of what its requests will still take "
               f"reach zero within {m} minutes ({K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION}), having fallen under their lowest "
               f"of the {wave} before (a load wave that stays above the last one's bottom does not page), or fewer than one p99-sized request fits "
               f"({K.POOL_SEATS_P99} < 1) while the requests waiting in the pool are rising. New requests "
               "queue and running ones are preempted: add replicas now, or shed batch traffic.",
               TOPIC_KV_SATURATION,
               f"A pool's free KV tokens are forecast to run out within {m} minutes, or have run out while "
               "its queue grows (vLLM queues only once the cache is full).",
               base_url, extra, fleet, group=K.GROUP),
    ]


def capacity_group(opts: CapacityOptions, alerts: list[HealthAlert]) -> RuleGroup:
    """Recording rules first (a group evaluates in order), then the alerts on them."""
    return RuleGroup(K.GROUP, [*recording_rules(opts), *(a.rule for a in alerts)])
