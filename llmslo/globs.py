"""Model-name globs (`llama-3-8b*,chat-*`), read the same way by the tap and by slogen's PromQL."""

from __future__ import annotations

import re
from functools import lru_cache


def glob_regex(globs: str) -> str:
    """Comma-separated globs as one RE2/Python alternation: `*` any run, `?` one character, all else literal.

    One definition, because the tap classifies requests with it and slogen writes it into label matchers:
    the same `models:` string must select the same models in both.
    """
    parts = []
    for g in (x.strip() for x in globs.split(",")):
        if not g:
            continue
        out = []
        for ch in g:
            if ch == "*":
                out.append(".*")
            elif ch == "?":
                out.append(".")
            else:
                out.append(re.escape(ch) if not ch.isalnum() and ch not in "-_/:" else ch)
        parts.append("".join(out))
    return "|".join(parts)


@lru_cache(maxsize=256)
def compiled(globs: str) -> re.Pattern[str]:
    return re.compile(f"(?:{glob_regex(globs)})")


def matches(globs: str, name: str) -> bool:
    """Whether `name` matches any of the comma-separated globs, anchored at both ends as PromQL's =~ is."""
    return bool(globs.strip(", ")) and compiled(globs).fullmatch(name) is not None
