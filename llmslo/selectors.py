"""The `selector` option of the llmslo/* SLI plugins: PromQL label matchers in braces, read into typed tuples.

One reader, because slogen writes the matchers into its queries and checks which engine kinds they pick
(`llmslo.engine_thresholds`), and the tap refuses the same malformed selectors slogen does.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from llmslo.plugin_errors import PluginOptionError

_MATCHER_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class Matcher(NamedTuple):
    """One label matcher, e.g. `namespace=~"$namespace"`: the one Matcher type (slogen.promql renders it).

    `quoted` is the value as written between the double quotes (already escaped), so a matcher
    parsed from a spec's selector renders back exactly as its author wrote it.
    """

    label: str
    op: str  # = != =~ !~
    quoted: str

    def render(self) -> str:
        return f'{self.label}{self.op}"{self.quoted}"'


def parse_selector(text: str) -> tuple[Matcher, ...]:
    """`{namespace="llm", model=~"x.*"}` -> matchers; PluginOptionError naming `selector` otherwise."""
    body = text.strip()
    if not body:
        return ()
    if not (body.startswith("{") and body.endswith("}")):
        raise PluginOptionError(f"selector {text!r} must be label matchers in braces", "selector",
                                'write it like {namespace="llm"}')
    body = body[1:-1].strip()
    matchers: list[Matcher] = []
    pos = 0
    while pos < len(body):
        m = _MATCHER_RE.match(body, pos)
        if not m:
            raise PluginOptionError(f"cannot parse label matchers in selector {text!r} at {body[pos:]!r}", "selector",
                                    'use name="value", name!="value", name=~"regex" or name!~"regex", comma-separated')
        matchers.append(Matcher(m.group(1), m.group(2), m.group(3)))
        pos = m.end()
        if pos < len(body):
            if body[pos] != ",":
                raise PluginOptionError(f"expected ',' in selector {text!r} at {body[pos:]!r}", "selector",
                                        "separate matchers with commas")
            pos += 1
    return tuple(matchers)


def unquote(value: str) -> str:
    """A matcher value as written between PromQL's double quotes, unescaped (a doubled backslash becomes one)."""
    return re.sub(r"\\(.)", r"\1", value)


def quote(value: str) -> str:
    """The inside of a double-quoted PromQL string literal for `value`."""
    return value.replace("\\", "\\\\").replace('"', '\\"')
