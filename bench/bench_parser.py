"""Exposition parsing: our parser against prometheus_client's on every engine sample page, in the same run.

For each page: MB/s of `exporter.promtext.parse_page` keeping only the families the adapters read (`WANT_ALL`, what
an `auto` target parses with), of the same parser keeping everything (`want=None`), and of
`prometheus_client.parser.text_string_to_metric_families` consuming the page. The three are timed in
interleaved rounds and each keeps its best round, so a noisy neighbour slows them alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.report import Row
from exporter import promtext
from exporter.adapters import WANT_ALL

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / ".." / "shared" / "peers" / "engine-metrics"
SECTION = "Exposition parsing"
COMMAND = "python -m bench parser"
ROUNDS = 25
ROUND_SECONDS = 0.01  # each timed round runs a callable at least this long

NOTES = {
    SECTION: (
        "MB/s on each engine sample page (`../shared/peers/engine-metrics/`). *selective* keeps the families the "
        "adapters read (`exporter.adapters.WANT_ALL`, the `auto` case; a single engine's adapter keeps fewer) and "
        "skips the rest after a set lookup of each line's name; *all* keeps every family. The peer is "
        "`prometheus_client.parser.text_string_to_metric_families` on the same page in the same run, in "
        "interleaved rounds, best round each. Label strings parsed on an earlier page are reused (a bounded cache), "
        "as on every collection cycle after the first; *first parse* clears that cache before each parse."
    ),
}


def wanted_families() -> tuple[Collection[str], str]:
    """The union of the families every adapter reads: what an `auto` target keeps."""
    return WANT_ALL, "WANT_ALL"


def _per_call_seconds(fn: Callable[[], object]) -> float:
    """Seconds per call over one round of at least ROUND_SECONDS."""
    calls = 0
    start = time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= ROUND_SECONDS:
            return elapsed / calls


def _best_interleaved(fns: dict[str, Callable[[], object]]) -> dict[str, float]:
    best = {name: float("inf") for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            best[name] = min(best[name], _per_call_seconds(fn))
    return best


def _first_parse(text: str, want: Collection[str]) -> None:
    promtext.clear_label_cache()
    promtext.parse_page(text, want)


def _contenders(text: str, want: Collection[str]) -> dict[str, Callable[[], object]]:
    """The parses raced on one page: the reference, ours selective, ours keeping all, ours from a cold cache."""
    return {
        "peer": lambda: list(text_string_to_metric_families(text)),
        "selective": lambda: promtext.parse_page(text, want),
        "all": lambda: promtext.parse_page(text),
        "first": lambda: _first_parse(text, want),
    }


def run() -> list[Row]:
    if not PAGES.is_dir():
        return []
    want, want_source = wanted_families()
    rows: list[Row] = []
    for page in sorted(PAGES.glob("*.prom")):
        text = page.read_text()
        mb = len(text.encode()) / 1e6
        kept = len(promtext.parse_page(text, want).families)
        best = _best_interleaved(_contenders(text, want))
        peer = mb / best["peer"]
        for key, what in (
            ("selective", f"{page.name}: selective ({want_source}, {kept} families kept)"),
            ("all", f"{page.name}: all families (want=None)"),
            ("first", f"{page.name}: selective, first parse (cold label cache)"),
        ):
            ours = mb / best[key]
            rows.append(Row(SECTION, what, f"{ours:.1f} MB/s", f"{peer:.1f} MB/s", f"{ours / peer:.1f}x", COMMAND))
    return rows
