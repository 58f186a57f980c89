"""promtool unit tests for the tap injector's alert (slogen/rules/injector.py), staged per build.

An injector is scraped throughout (its counters at 0 from the start); from 5m to 35m the API server's handshakes
fail (`tls`: a caBundle that is not the serving certificate's CA) while a caller posts malformed bodies the whole
time (`bad_json`: not the API server, not alerted). It fires once the failures have lasted `for`, once for the
cluster, and clears when they stop. The absent arm (no injector scraped) is staged by tests/slogen/test_injector.py.
"""

from __future__ import annotations

from llmslo import conventions as c
from llmslo.conventions import HEALTH as H
from slogen.promtests.health_tests import CLUSTER, Scenario
from slogen.rules.health import HealthOptions

FAILING_FROM, FAILING_UNTIL = 5, 35  # minutes


def injector_scenarios(opts: HealthOptions) -> dict[str, Scenario]:
    if not opts.tap_injector:
        return {}
    for_, window = opts.tap_injector_for // 60_000, opts.tap_injector_window // 60_000
    end = FAILING_UNTIL + window + 10
    target = {c.LABEL_CLUSTER: CLUSTER, "pod": "llmslo-tap-injector-5d8c7-abcde"}
    failing = FAILING_UNTIL - FAILING_FROM
    series = (
        (c.TAP_INJECTOR_INJECTED.name, target, f"0+1x{end}"),
        (c.TAP_INJECTOR_ERRORS.name, {**target, c.LABEL_REASON: "tls"},
         f"0x{FAILING_FROM} 1+1x{failing} {failing + 1}x{end - FAILING_UNTIL}"),
        (c.TAP_INJECTOR_ERRORS.name, {**target, c.LABEL_REASON: "bad_json"}, f"0+3x{end}"),
    )
    first = FAILING_FROM + 1 + for_  # the rate is over 0 from the first failed minute
    return {H.TAP_INJECTOR_FAILING: Scenario(
        f"the API server's handshakes failing from {FAILING_FROM}m to {FAILING_UNTIL}m fire after {for_}m, once for "
        "the cluster, and clear when they stop; a caller's malformed bodies the whole time do not",
        series, {c.LABEL_CLUSTER: CLUSTER},
        quiet=(4, first - 2, FAILING_UNTIL + window + 2), firing=(first + 1, FAILING_UNTIL))}
