"""Shared pieces of the loaders: an error reporter that knows the file, field readers that
report type errors with the field's path and line, and the validation rules Sloth applies
(names, objective, labels, SLI templates, alert names), plus slogen's own (reserved labels).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from llmslo import fields
from llmslo.conventions import SLO as C
from llmslo.ranges import ALLOW_KEY
from llmslo.ranges import check as range_check
from llmslo.specfile import LineDict
from llmslo.suggest import closest
from slogen.errors import SpecError, SpecFields

NAME_RE = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9]$")
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
WINDOW_TPL_RE = re.compile(r"{{ *\.window *}}")
RESERVED_LABELS = frozenset(C.RESERVED_LABELS)


@dataclass
class Reporter:
    """Collects errors and warnings for one file; loaders keep going to report everything at once."""

    file: str
    errors: list[SpecError] = field(default_factory=list)
    warnings: list[SpecError] = field(default_factory=list)

    def error(self, message: str, field: str = "", *, slo: str = "", fix: str = "", line: int | None = None) -> None:
        self.errors.append(SpecError(self.file, message, field, slo, fix, line))

    def warn(self, message: str, field: str = "", *, slo: str = "", fix: str = "", line: int | None = None) -> None:
        self.warnings.append(SpecError(self.file, message, field, slo, fix, line))


def alert_name_for(who: str) -> str:
    """A Prometheus alert name for an SLO id: `chat-ttft` -> `ChatTtftBudgetBurn`."""
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", who) if part) + "BudgetBurn"


def line_of(node: Any, key: str | None = None) -> int | None:
    if isinstance(node, LineDict):
        return node.line_of(key) if key else node.line
    return getattr(node, "line", None)


def mapping_or_empty(node: dict, key: str) -> dict:
    """`node[key]` where it is a mapping, else an empty one (for optional sections read without a report)."""
    value = node.get(key)
    return value if isinstance(value, dict) else {}


def join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def mapping(r: Reporter, parent: Any, key: str, prefix: str, *, slo: str = "", required: bool = False) -> dict:
    """parent[key] as a mapping ({} when absent, with an error when present but not a mapping)."""
    value = parent.get(key) if isinstance(parent, dict) else None
    if value is None:
        if required:
            r.error(f"{key} is required", join(prefix, key), slo=slo, line=line_of(parent, key),
                    fix=f"add a {key}: mapping")
        return {}
    if not isinstance(value, dict):
        r.error(f"{key} must be a mapping, got {type(value).__name__}", join(prefix, key), slo=slo,
                line=line_of(parent, key), fix=f"write {key} as `key: value` lines")
        return {}
    return value


class _SloFields(SpecFields):
    """llmslo.fields' reader over one mapping of a spec, its problems the loader's errors with the SLO named;
    a key written with no value (null) reads as absent, as Sloth reads it."""

    NULL_IS_ABSENT = True

    def __init__(self, r: Reporter, parent: Any, prefix: str, slo: str):
        super().__init__(r.file, prefix, parent if isinstance(parent, dict) else {}, r.errors)
        self.slo = slo

    def problem(self, key: str, message: str, fix: str) -> SpecError:
        return SpecError(self.file, message, self.field(key), self.slo, fix, self.line_of(key))


def string(r: Reporter, parent: Any, key: str, prefix: str, *, slo: str = "", default: str = "") -> str:
    return _SloFields(r, parent, prefix, slo).get(key, fields.scalar, default, f"quote the value of {key}")


def boolean(r: Reporter, parent: Any, key: str, prefix: str, *, slo: str = "") -> bool:
    return _SloFields(r, parent, prefix, slo).get(key, fields.boolean, False)


def number(r: Reporter, parent: Any, key: str, prefix: str, *, slo: str = "", example: str = "99.9") -> float | None:
    """parent[key] as a finite float (None when absent, or with an error when not a finite number)."""
    read = partial(fields.finite, write=f"{key}: {example}", strings=True)
    return _SloFields(r, parent, prefix, slo).get(key, read, None)


def labels(r: Reporter, parent: Any, key: str, prefix: str, *, slo: str = "", what: str = "label") -> dict[str, str]:
    """A string map (labels or annotations), checking keys and values as Prometheus would."""
    raw = mapping(r, parent, key, prefix, slo=slo)
    out: dict[str, str] = {}
    for k, v in raw.items():
        f = f"{join(prefix, key)}.{k}"
        if v is None or isinstance(v, (dict, list)):
            r.error(f"{what} {k!r} must have a string value", f, slo=slo, line=line_of(raw, k),
                    fix=f'write {k}: "value"')
            continue
        value = fields.scalar(v)
        key_s = str(k)
        if what == "label":
            if key_s == "__name__" or not LABEL_NAME_RE.match(key_s):
                r.error(f"label name {key_s!r} is not valid", f, slo=slo, line=line_of(raw, k),
                        fix="use letters, digits and underscores, not starting with a digit")
        elif not LABEL_NAME_RE.match(key_s):
            r.error(f"annotation name {key_s!r} is not valid", f, slo=slo, line=line_of(raw, k),
                    fix="use letters, digits and underscores, not starting with a digit")
        if value == "":
            r.error(f"{what} {key_s!r} has an empty value", f, slo=slo, line=line_of(raw, k),
                    fix=f"give {key_s} a value or remove it")
        out[key_s] = value
    return out


def check_reserved(r: Reporter, values: dict[str, str], prefix: str, *, slo: str, line: int | None) -> None:
    """User labels may not overwrite the labels slogen's rules and dashboards identify SLOs by."""
    for k in sorted(set(values) & RESERVED_LABELS):
        r.error(f"label {k!r} is reserved: slogen sets it on every generated series and alert", f"{prefix}.{k}",
                slo=slo, line=line, fix=f"rename the label (e.g. user_{k}) or remove it")


def grouped_label(key: str, grouped: tuple[str, ...], *, alert: bool) -> tuple[str, str]:
    """(problem, fix) for a fixed label the SLI's rules group by: on the rules it overwrites each series' own value
    (two clusters' series collide); on an alert it overwrites each alert's, and Prometheus fails the rule."""
    by = f"label {key!r} is one the SLI's rules group by (sum by ({', '.join(grouped)}))"
    if alert:
        why = (f"on an alert it would overwrite each alert's own {key}, and when two burn at once Prometheus fails "
               "the rule (vector contains metrics with the same labelset after applying alert labels): neither pages")
    else:
        why = f"a fixed value would overwrite each series' own {key}, and a ruler that sees two would fail every recording rule"
    keep = f"each alert keeps its series' own {key}" if alert else f"the series keep their own {key}"
    return f"{by}: {why}", f"remove the label ({keep}) or rename it (e.g. slo_{key})"


def check_grouped(r: Reporter, grouped: tuple[str, ...], values: Any, prefix: str, *, slo: str, alert: bool) -> None:
    """Refuse each label of `values` (a labels mapping as written) that the SLI's rules group by, at its own line."""
    for key in values if isinstance(values, dict) else ():
        if key in grouped:
            problem, fix = grouped_label(str(key), grouped, alert=alert)
            r.error(problem, f"{prefix}.{key}", slo=slo, line=line_of(values, key), fix=fix)


def check_name(r: Reporter, value: str, what: str, field: str, *, slo: str = "", line: int | None = None) -> None:
    if not value:
        r.error(f"{what} is required", field, slo=slo, line=line, fix=f"set {field.rsplit('.', 1)[-1]}")
    elif not NAME_RE.fullmatch(value):
        r.error(f"{what} {value!r} is not a valid name", field, slo=slo, line=line,
                fix="start and end with a letter or digit; use only letters, digits, '.', '_' and '-'")


def check_objective(r: Reporter, value: float | None, field: str, *, slo: str, line: int | None,
                    given: bool = False, plausible: bool = False) -> None:
    """`given`: the spec wrote a value that `number` already refused (None here), so say nothing more.
    `plausible`: also refuse a percent outside llmslo.ranges' objective range (0.99 looks like a ratio), unless
    the SLO sets allow_out_of_range."""
    if value is None:
        if not given:
            r.error("objective is required", field, slo=slo, line=line, fix="set objective: 99.9 (a percent)")
    elif plausible and 0 < value <= 100 and (wrong := range_check("objective", value)) is not None:
        keep = f"or set {ALLOW_KEY}: true on the SLO to keep {value:g}"
        r.error(wrong.message, field, slo=slo, line=line,
                fix=f"write objective: {wrong.suggested:g}, {keep}" if wrong.suggested is not None
                else f"write the objective as a percent, e.g. 99.9, {keep}")
    elif not (0 < value <= 100):
        r.error(f"objective {value:g} is out of range: it must be > 0 and <= 100", field, slo=slo, line=line,
                fix="write the objective as a percent, e.g. 99.9 (not 0.999, not 101)")


def check_query_template(r: Reporter, query: str, field: str, *, slo: str, line: int | None) -> None:
    """Sloth's rules (non-empty, has {{.window}}) plus a lexical PromQL check (brackets, quotes)."""
    if not query.strip():
        r.error("query is required", field, slo=slo, line=line, fix="write a PromQL query using [{{.window}}]")
        return
    if not WINDOW_TPL_RE.search(query):
        r.error("query must contain the {{.window}} template variable", field, slo=slo, line=line,
                fix="use the range [{{.window}}] in your rate()/increase() so slogen can fill each window")
    problem = promql_lexical_problem(WINDOW_TPL_RE.sub("1m", query))
    if problem:
        r.error(f"query is not valid PromQL: {problem}", field, slo=slo, line=line,
                fix="balance the brackets and quotes (run `slogen validate --promtool` for a full parse)")


_PAIRS = {")": "(", "]": "[", "}": "{"}


def promql_lexical_problem(expr: str) -> str:
    """A cheap syntax check: brackets balance and strings close. Full parsing is promtool's job."""
    stack: list[str] = []
    quote = ""
    escaped = False
    for ch in expr:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote != "`":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'`":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            if not stack or stack[-1] != _PAIRS[ch]:
                return f"unexpected {ch!r}"
            stack.pop()
    if quote:
        return "unterminated string"
    if stack:
        return f"unclosed {stack[-1]!r}"
    return ""


def unknown_keys(r: Reporter, node: Any, known: tuple[str, ...], prefix: str, *, slo: str = "",
                 elsewhere: Mapping[str, str] | None = None) -> None:
    """Unknown keys are warnings (Sloth ignores them; `--strict` makes them errors). The message says where a
    key that belongs elsewhere goes (`elsewhere`: key -> its place, e.g. options -> sli.plugin), or which
    known key a typo is closest to (llmslo.suggest)."""
    if not isinstance(node, dict):
        return
    for k in node:
        if k in known:
            continue
        key = str(k)
        where = f" in {prefix}" if prefix else " at the top level"
        place = (elsewhere or {}).get(key)
        near = closest(key, known)
        if place is not None:
            message, fix = f"unknown key {key!r}{where}: it belongs under {place}", f"move it under {place}"
        elif near:
            message, fix = f"unknown key {key!r}{where} is ignored", f"did you mean {near}?"
        else:
            message, fix = f"unknown key {key!r}{where} is ignored", f"known keys: {', '.join(known)}"
        r.warn(message, join(prefix, key), slo=slo, line=line_of(node, k), fix=fix)
