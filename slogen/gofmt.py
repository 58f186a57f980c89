"""Number and string formatting as Go prints it, so `--sloth-compat` output matches Sloth's.

Sloth renders floats with `%g`/`%v` and `strconv.FormatFloat(f, 'f', -1, 64)`: `go_g` and `go_f`
in llmslo.gofloat (the one float formatter the exporter and the tap use too).
"""

from __future__ import annotations

import re

_ESCAPED = re.compile(r'["\\\x00-\x1f\x7f]')  # what strconv.Quote escapes among the texts we meet


def go_quote(s: str) -> str:
    """strconv.Quote for the label values we meet (printable ASCII and UTF-8 text)."""
    if not _ESCAPED.search(s):  # most label values: nothing to escape (a build quotes half a million)
        return '"' + s + '"'
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def label_filter(labels: dict[str, str]) -> str:
    """prometheus/common LabelSet.String(): `{a="1", b="2"}`, keys sorted."""
    return "{" + ", ".join(f"{k}={go_quote(v)}" for k, v in sorted(labels.items())) + "}"


__all__ = ["go_quote", "label_filter"]
