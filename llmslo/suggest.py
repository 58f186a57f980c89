"""Did-you-mean for misspelt keys and options: the closest known name by edit distance.

One helper for every reader (slogen's loaders, the plugin option reader, the autoscaling spec, the exporter's
config), so a typo gets the same hint everywhere. Spelling variants (`pageAlert`, `page-alert`) count as the
same name; otherwise a name is suggested only when few edits separate it from the typo (at most a third of
its length, at least 1), so `threshhold` suggests `threshold` and `foo` suggests nothing.
"""

from __future__ import annotations

from collections.abc import Iterable


def distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions), with a transposition counted as one edit."""
    if a == b:
        return 0
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def _norm(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` most likely misspells, or None when none is close."""
    choices = [k for k in known if k != name]
    norm = _norm(str(name))
    for k in choices:
        if _norm(k) == norm:
            return k
    best: tuple[int, str] | None = None
    for k in choices:
        d = distance(norm, _norm(k))
        if d <= max(1, len(k) // 3) and (best is None or d < best[0]):
            best = (d, k)
    return best[1] if best else None


def hint(name: str, known: Iterable[str]) -> str:
    """'did you mean X?' or 'known: a, b, c', for an error's fix."""
    known = tuple(known)
    near = closest(name, known)
    return f"did you mean {near}?" if near else f"known: {', '.join(known)}"
