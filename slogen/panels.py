"""What the dashboards draw and their generated tests check, named once for both
(`slogen/artifacts/dashboards.py` and `slogen/promtests/dashboards.py`): the labels engine and pool
panels aggregate by, the latency quantiles with their query refs, and the late-requests panel's title.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from llmslo import conventions as c
from slogen.rules.isolation import HOLDERS_BY
from slogen.views import SLOView, window_seconds

ENGINE_BY = (c.LABEL_CLUSTER, c.LABEL_NAMESPACE, c.LABEL_POD, c.LABEL_NODE, c.LABEL_ENGINE, c.LABEL_MODEL)
POOL_BY = (c.LABEL_CLUSTER, c.LABEL_NAMESPACE, c.LABEL_MODEL)
QUANTILES = ((0.5, "A"), (0.9, "B"), (0.99, "C"))
LATE_TITLE = "Late requests, not in the percentiles (upstream_timeout, client_gave_up)"
# Who turns requests away: the engines at their own caps beside the taps (their limits and admission), by reason.
REFUSALS_TITLE = "Refused requests per engine and tap, by reason"
WAITING_BY_REASON_TITLE = "Waiting requests per engine, by why they wait"
GPUS_BY_POOL_TITLE = "GPUs held per node pool, node and pod"  # who holds the inference pool's GPUs (rules/isolation.py)
GPUS_BY_POOL_BY = HOLDERS_BY
# A gateway-sourced SLO (source llm-d, envoy-ai-gateway, dynamo): its latency per gateway pod (one ladder each),
# its availability from the gateway's own counters (slogen/artifacts/gateway_panels.py).
GATEWAY_AVAILABILITY_TITLE = "Failed vs counted requests, the gateway's own counters"


def gateway_latency_title(base: str, gateway_title: str) -> str:
    return f"{base}, per {gateway_title} pod"

# The SLO overview (slogen/artifacts/overview.py): its table, the firing-state words, its columns per tier.
OVERVIEW_TITLE = "SLOs: objective, SLI, error budget left, burn rate and alerts per tier"
FIRING_PAGE, FIRING_TICKET, FIRING_NONE = "page", "ticket", "none"


def overview_tiers(slos: Sequence[SLOView]) -> list[str]:
    """The build's alert tiers in column order: pages before tickets, the quickest (largest factor) first."""
    best: dict[str, tuple[int, float]] = {}
    for t in (t for s in slos for t in s.tiers):
        key = (t.severity != "page", -t.factor)
        best[t.name] = min(best.get(t.name, key), key)
    return sorted(best, key=lambda name: (*best[name], name))


def overview_burn_columns(slos: Sequence[SLOView]) -> list[tuple[str, str]]:
    """(tier, long window) per burn-rate column: one per tier, more where SLOs' periods give a tier other windows."""
    pairs = {(t.name, t.long_window) for s in slos for t in s.tiers}
    order = overview_tiers(slos)
    return sorted(pairs, key=lambda p: (order.index(p[0]), window_seconds(p[1])))


def firing_label(tier: str) -> str:
    """The label the overview's firing query writes a tier's state into (a label name: [a-zA-Z_][a-zA-Z0-9_]*)."""
    return "alerts_" + re.sub(r"[^A-Za-z0-9_]", "_", tier)


def overview_ref(i: int) -> str:
    """The refId of the overview's i-th query: A, B, ..., Z, then AA, AB, ..."""
    return chr(65 + i) if i < 26 else overview_ref(i // 26 - 1) + chr(65 + i % 26)
