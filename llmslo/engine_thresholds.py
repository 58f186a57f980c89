"""Which threshold an engine-sourced `llmslo/latency` SLI can measure: a bucket edge of every engine it selects.

The exporter keeps each engine's own bucket edges, so `bucket{le=T} / count` is exact only where T is an
edge (llmslo/bucket_edges.py). Part of the plugin contract, not of slogen alone: the tap's loader runs
the same check so that it refuses exactly the specs `slogen validate` refuses.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from llmslo import bucket_edges as be
from llmslo import conventions as c
from llmslo.engine_versions import BUCKETS_OPTION, VERSIONS_OPTION, Declared, edge_rows
from llmslo.plugin_errors import PluginOptionError
from llmslo.selectors import Matcher, unquote

# threshold_rounding: measure at the nearest bucket edge that every selected engine has.
ROUND_DOWN = "down"  # the edge below: a stricter objective than written
ROUND_UP = "up"  # the edge above: a looser one
ROUNDINGS = (ROUND_DOWN, ROUND_UP)


def _matches_kind(op: str, value: str, kind: str) -> bool:
    literal = unquote(value)
    if op == "=":
        return kind == literal
    if op == "!=":
        return kind != literal
    try:
        hit = re.fullmatch(literal, kind) is not None
    except re.error:
        return True  # a regex Python cannot read: the kind may be selected (the check stays on the safe side)
    return hit if op == "=~" else not hit


def engine_kinds(matchers: Sequence[Matcher]) -> tuple[str, ...]:
    """The engine kinds (the exporter's `engine` label values) that the SLI's `engine` matchers let through."""
    engine = [(op, value) for name, op, value in matchers if name == c.LABEL_ENGINE]
    return tuple(k for k in c.SERVING_ENGINE_KINDS if all(_matches_kind(op, value, k) for op, value in engine))


def _where(edges: tuple[float, ...], threshold: float) -> str:
    if not edges:
        return "no finite edge (count and sum only)"
    lo, hi = be.nearest(edges, threshold)
    t = be.edge_text(threshold)
    if lo is None and hi is not None:
        return f"{t} < {be.edge_text(hi)}, its first edge"
    if hi is None and lo is not None:
        return f"{be.edge_text(lo)}, its last edge, < {t}"
    if lo is None or hi is None:
        return f"{t}, an edge itself"
    return f"{be.edge_text(lo)} < {t} < {be.edge_text(hi)}"


def _pin_example(kinds: tuple[str, ...]) -> str:
    inner = f'engine="{kinds[0]}"' if len(kinds) == 1 else f'engine=~"{"|".join(kinds)}"'
    return f"selector: '{{{inner}}}'"


def _constraint(row: be.EdgeRow) -> str:
    """A row's versions as an engine_versions constraint (the narrowest one a spec can write)."""
    since = ".".join(map(str, row.since)) if row.since else ""
    until = ".".join(map(str, row.until)) if row.until else ""
    if since and until:
        return f">={since}, {row.kind}<{until}"
    return f">={since}" if since else (f"<{until}" if until else "")



def _rounded(down: float | None, up: float | None, rounding: str) -> float | None:
    """The edge `threshold_rounding` names of the nearest edges below and above (down, up); None when there is
    none that way or no rounding was asked for."""
    return down if rounding == ROUND_DOWN else up if rounding == ROUND_UP else None

def measurable_threshold(metric: str, threshold: float, matchers: Sequence[Matcher], rounding: str,
                         decl: Declared = Declared({}, {})) -> float:
    """The threshold an engine-sourced latency SLI measures: `threshold` itself when it is a bucket edge
    of every engine kind and version the SLI's selector may pick (narrowed to the versions and buckets the
    spec declares, llmslo/engine_versions.py), else the common edge `rounding` names; PluginOptionError
    naming the nearest edges and the fixes otherwise."""
    kinds = engine_kinds(matchers)
    if not kinds:
        raise PluginOptionError(f"the selector's engine matchers pick no engine kind the exporter knows "
                                f"({', '.join(c.SERVING_ENGINE_KINDS)}), so the SLI would measure nothing", "selector",
                                "match the engine label against those kind names, e.g. " + _pin_example((c.ENGINE_VLLM,)))
    selected = edge_rows(kinds, metric, decl)
    if not selected:
        exporters = tuple(dict.fromkeys(r.kind for r in be.rows(metric=metric)))
        raise PluginOptionError(f"no engine kind this SLI selects ({', '.join(kinds)}) exports a {metric} histogram",
                                "metric",
                                f"select an engine that does ({_pin_example(exporters)}), or use source: \"tap\"")
    off = [r for r in selected if not r.has_edge(metric, threshold)]
    if not off:
        return threshold
    down, up = be.nearest(be.common_edges(selected, metric), threshold)
    rounded = _rounded(down, up, rounding)
    if rounded is not None:
        return rounded
    t = be.edge_text(threshold)
    groups: dict[tuple[str, str], list[str]] = {}
    for r in off:
        groups.setdefault((r.kind, _where(r.edges[metric], threshold)), []).append(r.versions)
    where = "; ".join(f"{kind}{' ' + ', '.join(v for v in versions if v) if any(versions) else ''}: {text}"
                      for (kind, text), versions in groups.items())
    scope = (f"engine kind{'s' if len(kinds) > 1 else ''} {', '.join(kinds)}, as the selector picks them"
             if any(name == c.LABEL_ENGINE for name, _, _ in matchers)
             else "every engine kind, as the selector has no engine matcher")
    message = (f"threshold {t} s is not a bucket edge of the {metric} histogram of every engine this SLI may "
               f"select ({scope}); "
               f"where it is not, the exporter has no bucket le={t}, so the SLI is blind there (its burn alerts "
               f"cannot fire) or counts every request as too slow. Nearest edges: {where}")
    if decl.any:
        message += (". Edges of the declared engines: "
                    + "; ".join(f"{r.label}: {', '.join(be.edge_text(e) for e in r.edges[metric]) or 'none'}"
                                for r in selected))
    if rounding:
        message += (f". threshold_rounding: {rounding} finds no edge {'below' if rounding == ROUND_DOWN else 'above'} "
                    f"{t} that every selected engine has")
    fixes = []
    if down is not None or up is not None:
        choices = " or ".join(be.edge_text(e) for e in (down, up) if e is not None)
        fixes.append(f"write threshold {choices} (an edge every selected engine has)")
    on_edge = tuple(k for k in kinds if be.rows([k], metric) and all(r.has_edge(metric, threshold)
                                                                       for r in be.rows([k], metric)))
    if on_edge:
        fixes.append(f"select only the engines where {t} is an edge ({_pin_example(on_edge)})")
    elif len(kinds) > 1:
        fixes.append(f"select fewer engine kinds (e.g. {_pin_example((off[0].kind,))}) and choose among their edges")
    fitting = {r.kind: r for r in reversed(selected) if r.has_edge(metric, threshold)}  # the newest row per kind
    if fitting and not decl.versions:
        runs = ", ".join(f"{r.kind}{_constraint(r)}" for r in reversed(fitting.values()))
        fixes.append(f"if you run only versions that have it, declare them: {VERSIONS_OPTION}: \"{runs}\"")
    fixes.append(f"if your engines run with their own buckets, declare them: {BUCKETS_OPTION}: "
                 f"\"{off[0].kind}: <edges, seconds>\"")
    if down is not None:
        fixes.append(f'set threshold_rounding: "down" to measure le={be.edge_text(down)} instead (a stricter objective)')
    if up is not None:
        fixes.append(f'set threshold_rounding: "up" to measure le={be.edge_text(up)} instead (a looser objective)')
    raise PluginOptionError(message, "threshold_rounding" if rounding else "threshold", "; or ".join(fixes))


def gateway_threshold(source: str, metric: str, threshold: float, rounding: str,
                      buckets: tuple[float, ...] | None = None) -> float:
    """The threshold a gateway-sourced latency SLI measures: `threshold` when it is an edge of the gateway's current
    histogram (llmslo/bucket_edges.py GATEWAY_ROWS) or of the `buckets` the spec declares, else the edge `rounding`
    names; PluginOptionError naming the nearest edges, the older releases' rows and the fixes otherwise."""
    rows = ([be.EdgeRow(source, "(custom buckets)", {metric: buckets}, f"the spec's {BUCKETS_OPTION} option")]
            if buckets is not None else be.gateway_rows(source, metric, current=True))
    edges = tuple(e for e in rows[0].edges[metric] if e > 0) if rows else ()
    if threshold in edges:
        return threshold
    down, up = be.nearest(edges, threshold)
    rounded = _rounded(down, up, rounding)
    if rounded is not None:
        return rounded
    t = be.edge_text(threshold)
    where = _where(edges, threshold)
    older = [r for r in be.gateway_rows(source, metric) if r.until is not None and r.has_edge(metric, threshold)]
    message = (f"threshold {t} s is not a bucket edge of {source}'s {metric} histogram "
               f"({rows[0].label if rows else source}: {where}); the gateway has no bucket le={t}, so the SLI "
               f"would be blind (its burn alerts cannot fire)")
    if rounding:
        message += f". threshold_rounding: {rounding} finds no edge {'below' if rounding == ROUND_DOWN else 'above'} {t}"
    fixes = []
    if down is not None or up is not None:
        fixes.append(f"write threshold {' or '.join(be.edge_text(e) for e in (down, up) if e is not None)}")
    if down is not None:
        fixes.append(f'set threshold_rounding: "down" to measure le={be.edge_text(down)} instead (a stricter objective)')
    if up is not None:
        fixes.append(f'set threshold_rounding: "up" to measure le={be.edge_text(up)} instead (a looser objective)')
    if older:
        fixes.append(f"if you run {older[0].label}, declare its edges: {BUCKETS_OPTION}: "
                     f"\"{', '.join(be.edge_text(e) for e in older[0].edges[metric] if e > 0)}\"")
    else:
        fixes.append(f"if your {source} runs with other buckets, declare them: {BUCKETS_OPTION}: \"<edges, seconds>\"")
    raise PluginOptionError(message, "threshold_rounding" if rounding else "threshold", "; or ".join(fixes))
