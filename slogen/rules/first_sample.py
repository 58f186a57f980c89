"""A counter's first sample is an increase too: rewriting user-written SLI queries so it counts.

`rate()` and `increase()` read the change between samples, so a series born within the window (a client
library creates `http_requests_total{code="500"}` at its first 5xx) hides its first sample's value: at 6
requests an hour a full outage pages at the 4th failure, not the 3rd. slogen's own series (the tap's, the
exporter's) are created at 0, but a user's counter in a raw `events:` or good/total SLI is not slogen's.

So each `rate(SEL[{{.window}}])` of such a query becomes, per series,

    rate(SEL[W]) and SEL offset W                       a series that existed a window ago: as before
    or (last_over_time(SEL[W]) unless SEL offset W) / W  a series born within the window: from 0 to its value

and `increase(SEL[W])` the same without the division: a counter born in the window counts from 0, as the
client library that created it did. Only a plain selector's rate or increase is rewritten; anything else is
left as written (a subquery, a rate over a recording rule's output is the user's to shape).
"""

from __future__ import annotations

import re

from llmslo.durations import format_prometheus_duration
from llmslo.gofloat import go_g

_STRING = r'"(?:\\.|[^"\\])*"'
_SELECTOR = rf"(?:[A-Za-z_:][A-Za-z0-9_:]*\s*(?:\{{(?:[^{{}}\"]|{_STRING})*\}})?|\{{(?:[^{{}}\"]|{_STRING})*\}})"
_CALL = re.compile(rf"\b(rate|increase)\(\s*({_SELECTOR})\s*\[\s*{{{{ *\.window *}}}}\s*\]\s*\)")


def count_first_samples(query: str, window_ms: int) -> str:
    """`query` with each rate/increase of a plain selector over `{{.window}}` counting series born in the window."""
    w = format_prometheus_duration(window_ms)
    seconds = go_g(window_ms / 1000)

    def rewrite(m: re.Match) -> str:
        fn, sel = m.group(1), m.group(2).strip()
        born = f"(last_over_time({sel}[{w}]) unless {sel} offset {w})"
        if fn == "rate":
            born = f"{born} / {seconds}"
        return f"(({fn}({sel}[{w}]) and {sel} offset {w}) or {born})"

    return _CALL.sub(rewrite, query)


__all__ = ["count_first_samples"]
