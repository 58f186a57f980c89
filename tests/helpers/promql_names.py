"""Pull the metric names out of a PromQL expression.

Why: every query slogen writes into a dashboard, a KEDA trigger or a runbook must name only
series that the exporter, the tap or the generated rules produce. Tests parse the names back
out and compare them with `llmslo.conventions` and the generated recording rules, so a rename or a typo fails loudly instead of drawing an empty panel.

This is a tokenizer, not a full parser: it understands strings, label matchers `{...}`, range
and subquery brackets `[...]`, grouping clauses (`by`, `without`, `on`, `ignoring`,
`group_left`, `group_right`), function calls, keywords, numbers, durations and Grafana's
`$variables`. That is enough to classify every bare identifier as a metric name or not.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<var>\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\])
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+(?![A-Za-z0-9_:]))
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,(){}\[\]@])
    """,
    re.VERBOSE,
)

# Words that are never metric names where they stand bare.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
     "group_right", "inf", "nan", "start", "end", "atan2"}
)
# Clauses followed by a parenthesised list of label names (not metric names).
_LABEL_LIST_CLAUSES = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})


class PromQLTokenError(ValueError):
    """The expression holds a character sequence that is not PromQL."""


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise PromQLTokenError(f"unexpected character {expr[pos]!r} at offset {pos} in: {expr}")
        kind = m.lastgroup or ""
        if kind not in ("ws", "comment"):
            out.append((kind, m.group()))
        pos = m.end()
    return out


def metric_names(expr: str) -> set[str]:
    """Every metric name the expression selects, including `{__name__="..."}` selectors."""
    tokens = _tokens(expr)
    names: set[str] = set()
    brace_depth = 0  # inside {...}: label matchers
    bracket_depth = 0  # inside [...]: ranges and subquery steps
    label_list_depth = 0  # paren depth of a by(...)/on(...) list we are inside, 0 when none
    paren_depth = 0
    pending_label_list = False
    for i, (kind, text) in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "op":
            if text == "{":
                brace_depth += 1
            elif text == "}":
                brace_depth -= 1
            elif text == "[":
                bracket_depth += 1
            elif text == "]":
                bracket_depth -= 1
            elif text == "(":
                paren_depth += 1
                if pending_label_list:
                    label_list_depth = paren_depth
                    pending_label_list = False
            elif text == ")":
                if label_list_depth == paren_depth:
                    label_list_depth = 0
                paren_depth -= 1
            continue
        if brace_depth:
            # Inside matchers only `__name__` selects a metric.
            if kind == "ident" and text == "__name__" and nxt[1] == "=":
                value = tokens[i + 2][1] if i + 2 < len(tokens) else ""
                names.add(value[1:-1])
            continue
        if bracket_depth or label_list_depth or kind != "ident":
            continue
        lowered = text.lower()
        if lowered in _LABEL_LIST_CLAUSES:
            pending_label_list = nxt[1] == "("
            continue
        if lowered in _KEYWORDS:
            continue
        if nxt[1] == "(" or nxt[1].lower() in ("by", "without"):
            continue  # a function, or an aggregation operator (`sum by (le) (...)`)
        names.add(text)
    return names
