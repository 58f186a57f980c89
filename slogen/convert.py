"""`slogen convert`: Pyrra ServiceLevelObjectives to the Sloth `prometheus/v1` specs slogen reads.

The SLOs come from the Pyrra loader (`slogen.loaders.pyrra`), so a converted file and the Pyrra file
load to the same SLOs. What Sloth's format cannot say per SLO goes where slogen reads it: Pyrra's alert
windows become one `AlertWindows` catalog per window (with the slogen keys `burnFactor` and `for`), the
window a per-SLO `period`, and a bool_gauge SLI (its events are samples, which never run low) turns the
low-traffic guard off with `page_min_bad_events: 0`. One `prometheus/v1` document per service.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from llmslo.durations import format_prometheus_duration as dur
from slogen.errors import SpecError, SpecErrors
from slogen.loaders import load_paths
from slogen.loaders.pyrra import API_VERSION
from slogen.loaders.windows import API_VERSION as WINDOWS_API
from slogen.loaders.windows import KIND as WINDOWS_KIND
from slogen.loaders.windows import merge
from slogen.model import SLO, AlertMeta, AlertWindow, AlertWindows, EventsSLI, Rule
from slogen.rules import SLOResult, generate
from slogen.rules.options import GenOptions
from slogen.yamlio import dump


def convert_paths(paths: list[str]) -> tuple[str, list[SpecError]]:
    """The converted YAML of every Pyrra SLO under `paths`, and the loader's warnings; SpecErrors (all of
    them, from every file) when a file does not load or holds something other than Pyrra SLOs."""
    loaded = load_paths(list(paths), raise_errors=False)
    errors = list(loaded.errors)
    for slo in loaded.slos:
        if slo.origin.spec != API_VERSION:
            errors.append(SpecError(slo.origin.file, f"SLO {slo.id!r} is a {slo.origin.spec} spec, not a Pyrra one",
                                    slo.origin.path, slo.id, "slogen reads it as it is: leave it out of convert's inputs",
                                    slo.origin.line))
    for w in loaded.windows:
        errors.append(SpecError(w.source, "an AlertWindows catalog is not a Pyrra SLO", "kind",
                                fix="leave it out of convert's inputs (slogen reads it as it is)"))
    if errors:
        raise SpecErrors(errors)
    if not loaded.slos:
        raise SpecErrors([SpecError(", ".join(map(str, paths)), "no Pyrra ServiceLevelObjective found",
                                    fix="pass files with apiVersion: pyrra.dev/v1alpha1, kind: ServiceLevelObjective")])
    text = render(loaded.slos, loaded.files)
    problems = lint_problems(text)
    if problems:
        raise SpecErrors(problems)
    return text, loaded.warnings


def lint_problems(text: str) -> list[SpecError]:
    """What `promtool check rules --lint=all` would report of the rules the converted `text` generates, in
    `slogen build`'s mode and in Sloth's: two rules of one output file (one per service) with the same name and
    labels. convert writes nothing when there is one."""
    with tempfile.TemporaryDirectory(prefix="slogen-convert-") as tmp:
        path = Path(tmp) / "converted.yaml"
        path.write_text(text, encoding="utf-8")
        loaded = load_paths([path])
    out = []
    for compat in (False, True):
        opts = GenOptions(sloth_compat=compat, windows=merge(loaded.windows))
        out += duplicate_rules(generate(loaded.slos, opts), "Sloth's" if compat else "slogen's")
    return out


def duplicate_rules(results: list[SLOResult], mode: str = "slogen's") -> list[SpecError]:
    """Rules of one service's file that share their name and labels (promtool's duplicate-rules lint): one
    error per pair of SLOs, naming the first such rule."""
    seen: dict[tuple, SLOResult] = {}
    pairs: dict[tuple[str, str], SpecError] = {}
    for r in results:
        for rule in (rule for group in r.rules.groups() for rule in group.rules):
            key = (r.slo.service, rule.record or rule.alert, tuple(sorted(rule.labels.items())))
            first = seen.setdefault(key, r)
            if first is r and rule is _first_rule(r, key):
                continue
            pairs.setdefault((first.slo.id, r.slo.id), SpecError(
                r.slo.origin.file, f"{mode} rules of SLO {r.slo.id!r} and SLO {first.slo.id!r} both have a rule "
                f"{key[1]} with labels {dict(key[2])}: promtool check rules --lint=all reports them as duplicates",
                "", r.slo.id, "give the SLOs different alert names or labels (Pyrra's own alerts carry slo: "
                "<metadata.name>)", r.slo.origin.line))
    return list(pairs.values())


def _first_rule(r: SLOResult, key: tuple) -> Rule:
    return next(rule for group in r.rules.groups() for rule in group.rules
                if (r.slo.service, rule.record or rule.alert, tuple(sorted(rule.labels.items()))) == key)


def render(slos: list[SLO], sources: list[str]) -> str:
    head = ("# Converted by `slogen convert` from Pyrra ServiceLevelObjectives: " + ", ".join(sources) + "\n"
            "# The AlertWindows catalogs carry Pyrra's burn-rate windows; every SLO with that period loaded\n"
            "# with them uses them (docs/slogen.md, \"Moving from Pyrra\").\n")
    docs: list[Any] = []
    seen: set[int] = set()
    for slo in slos:
        if slo.windows is not None and slo.windows.period not in seen:
            seen.add(slo.windows.period)
            docs.append(catalog(slo.windows))
    services: dict[str, list[dict]] = {}
    for slo in slos:
        services.setdefault(slo.service, []).append(_slo(slo))
    docs += [{"version": "prometheus/v1", "service": service, "slos": items} for service, items in services.items()]
    return head + "".join("---\n" + dump(d) for d in docs)


def catalog(w: AlertWindows) -> dict:
    """An AlertWindows document that loads back to `w` (factors and `for:` pinned)."""
    def tier(t: AlertWindow) -> dict:
        out: dict[str, Any] = {"shortWindow": dur(t.short_window), "longWindow": dur(t.long_window)}
        if t.factor is not None:
            out["burnFactor"] = int(t.factor) if t.factor == int(t.factor) else t.factor
        else:
            out["errorBudgetPercent"] = t.error_budget_percent
        if t.for_ is not None:
            out["for"] = dur(t.for_)
        return out

    return {"apiVersion": WINDOWS_API, "kind": WINDOWS_KIND,
            "metadata": {"name": f"pyrra-{dur(w.period)}"},
            "spec": {"sloPeriod": dur(w.period),
                     "page": {"quick": tier(w.page_quick), "slow": tier(w.page_slow)},
                     "ticket": {"quick": tier(w.ticket_quick), "slow": tier(w.ticket_slow)}}}


def _slo(slo: SLO) -> dict:
    sli = slo.sli
    assert isinstance(sli, EventsSLI)  # every Pyrra indicator is one
    out: dict[str, Any] = {"name": slo.name}
    if slo.description:
        out["description"] = slo.description
    out["objective"] = int(slo.objective) if slo.objective == int(slo.objective) else slo.objective
    if slo.period is not None:
        out["period"] = dur(slo.period)
    if sli.time_based:
        out["page_min_bad_events"] = 0
    if slo.labels:
        out["labels"] = dict(slo.labels)
    out["sli"] = {"events": {"error_query": sli.error_query, "total_query": sli.total_query}}
    a = slo.alerting
    alerting: dict[str, Any] = {"name": a.name} if a.name else {}
    shared = a.page.annotations if not a.page.disable else {}
    if shared:
        alerting["annotations"] = dict(shared)
    alerting["page_alert"] = _alert(a.page)
    alerting["ticket_alert"] = _alert(a.ticket)
    out["alerting"] = alerting
    return out


def _alert(meta: AlertMeta) -> dict:
    if meta.disable:
        return {"disable": True}
    return {"labels": dict(meta.labels)} if meta.labels else {}
