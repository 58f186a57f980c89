"""Which engines an engine-sourced latency SLI measures, as a spec declares them: versions and custom buckets.

Without a declaration, a threshold must be an edge of every version of every engine kind the selector may pick
(llmslo/bucket_edges.py), so an SGLang TTFT of 5 s is refused because SGLang 0.5 lacks the edge and 4 s because
SGLang <0.4.6 does. Two `llmslo/latency` options narrow the check to what an operator runs:

* `engine_versions: "sglang>=0.5, vllm>=0.11"`: the engines this SLI measures, one comma-separated entry per
  constraint (`kind`, `kind==0.5.23`, `kind>=0.5`, `kind<0.4.6`; entries naming the same kind all hold).
  Kinds not named are taken as not run; versions no table row covers are refused (nobody checked them).
* `buckets: "sglang: 0.5, 1, 5; vllm: 2.5, 5"`: the histogram edges of engines started with their own
  buckets (SGLang's --bucket-time-to-first-token, vLLM's and TensorRT-LLM's bucket settings), per kind, for
  this SLI's metric; a list without `kind:` applies to every kind. Declared buckets replace the table's rows.

Part of the plugin contract (the tap's loader runs the same check as `slogen validate`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from llmslo import bucket_edges as be
from llmslo import conventions as C
from llmslo.plugin_errors import PluginOptionError
from llmslo.suggest import closest

VERSIONS_OPTION = "engine_versions"
BUCKETS_OPTION = "buckets"
MAX_ENTRIES = 64  # a spec's list, not a data set: bounded like everything else a file controls

_ENTRY = re.compile(r"^([a-z][a-z0-9-]*)\s*(?:(==|>=|<=|>|<|=)\s*v?(\d+(?:\.\d+)*)\S*)?$")
_WIDTH = 4  # versions compare as 4 numbers (0.5 == 0.5.0.0); a bound just above v is v + (0,)


def _pad(v: tuple[int, ...]) -> tuple[int, ...]:
    return (v + (0,) * _WIDTH)[:_WIDTH]


def _text(v: tuple[int, ...]) -> str:
    parts = list(v[:_WIDTH]) or [0]
    while len(parts) > 2 and parts[-1] == 0:
        parts.pop()
    return ".".join(map(str, parts))


@dataclass(frozen=True)
class VersionRange:
    """Versions [lo, hi) of one engine kind (None: unbounded); what a spec says it runs."""

    lo: tuple[int, ...] | None = None
    hi: tuple[int, ...] | None = None

    def meet(self, other: "VersionRange") -> "VersionRange":
        lo = max((x for x in (self.lo, other.lo) if x is not None), default=None)
        hi = min((x for x in (self.hi, other.hi) if x is not None), default=None)
        return VersionRange(lo, hi)

    @property
    def empty(self) -> bool:
        return self.lo is not None and self.hi is not None and self.lo >= self.hi

    def describe(self) -> str:
        if self.lo is None and self.hi is None:
            return "every version"
        if self.lo is None:
            return f"<{_text(self.hi or ())}"
        if self.hi is None:
            return f">={_text(self.lo)}"
        return f">={_text(self.lo)}, <{_text(self.hi)}"


def _row_range(row: be.EdgeRow) -> VersionRange:
    return VersionRange(_pad(row.since) if row.since else None, _pad(row.until) if row.until else None)


def _kind(name: str, option: str) -> str:
    if name in C.SERVING_ENGINE_KINDS:
        return name
    near = closest(name, C.SERVING_ENGINE_KINDS)
    raise PluginOptionError(f"option {option!r} names engine {name!r}, not an engine kind the exporter knows", option,
                            (f"did you mean {near}? " if near else "") + f"use one of: {', '.join(C.SERVING_ENGINE_KINDS)}")


def parse_versions(text: str) -> dict[str, VersionRange]:
    """`engine_versions` as kind -> the versions run (entries naming one kind all hold)."""
    out: dict[str, VersionRange] = {}
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if len(entries) > MAX_ENTRIES:
        raise PluginOptionError(f"option {VERSIONS_OPTION!r} has {len(entries)} entries, more than {MAX_ENTRIES}",
                                VERSIONS_OPTION, "name each engine kind once or twice")
    for entry in entries:
        m = _ENTRY.match(entry)
        if m is None:
            raise PluginOptionError(f"option {VERSIONS_OPTION!r} has {entry!r}, not an engine version constraint",
                                    VERSIONS_OPTION, f'write {VERSIONS_OPTION}: "sglang>=0.5, vllm==0.11.2" '
                                    "(a kind, optionally ==, >=, >, <= or < and a version)")
        kind, op, number = _kind(m.group(1), VERSIONS_OPTION), m.group(2), m.group(3)
        rng = VersionRange()
        if op:
            v = _pad(tuple(int(x) for x in number.split(".")))
            rng = {"==": VersionRange(v, v + (0,)), "=": VersionRange(v, v + (0,)), ">=": VersionRange(v, None),
                   ">": VersionRange(v + (0,), None), "<=": VersionRange(None, v + (0,)),
                   "<": VersionRange(None, v)}[op]
        out[kind] = out.get(kind, VersionRange()).meet(rng)
        if out[kind].empty:
            raise PluginOptionError(f"option {VERSIONS_OPTION!r}: the constraints on {kind} leave no version",
                                    VERSIONS_OPTION, f"write one range per kind, e.g. {kind}>=0.5")
    return out


def parse_buckets(text: str) -> dict[str, tuple[float, ...]]:
    """`buckets` as kind ("" = every kind) -> its finite edges, ascending."""
    out: dict[str, tuple[float, ...]] = {}
    for part in (p.strip() for p in text.split(";") if p.strip()):
        kind, sep, rest = part.partition(":")
        kind = _kind(kind.strip(), BUCKETS_OPTION) if sep else ""
        values = rest if sep else part
        edges: list[float] = []
        for item in (x.strip() for x in values.split(",") if x.strip()):
            try:
                edge = float(item)
            except ValueError:
                edge = math.nan
            if not math.isfinite(edge) or edge <= 0:
                raise PluginOptionError(f"option {BUCKETS_OPTION!r} has {item!r}, not a positive number of seconds",
                                        BUCKETS_OPTION, f'write {BUCKETS_OPTION}: "sglang: 0.5, 1, 5" '
                                        "(each kind's edges in seconds, kinds separated by ;)")
            edges.append(edge)
        if not edges or len(edges) > 4 * MAX_ENTRIES:
            raise PluginOptionError(f"option {BUCKETS_OPTION!r} gives {len(edges)} edges for "
                                    f"{kind or 'every kind'}", BUCKETS_OPTION,
                                    f"list between 1 and {4 * MAX_ENTRIES} edges, e.g. {BUCKETS_OPTION}: \"0.5, 1, 5\"")
        if kind in out:
            raise PluginOptionError(f"option {BUCKETS_OPTION!r} names {kind or 'every kind'} twice", BUCKETS_OPTION,
                                    "give each kind's edges once")
        out[kind] = tuple(sorted(set(edges)))
    return out


@dataclass(frozen=True)
class Declared:
    """What a spec says it runs: versions per kind (empty: not said) and custom buckets per kind."""

    versions: dict[str, VersionRange]
    buckets: dict[str, tuple[float, ...]]

    @property
    def any(self) -> bool:
        return bool(self.versions or self.buckets)


def declared(versions_text: str, buckets_text: str) -> Declared:
    return Declared(parse_versions(versions_text) if versions_text else {},
                    parse_buckets(buckets_text) if buckets_text else {})


def _gaps(want: VersionRange, rows: list[be.EdgeRow]) -> list[VersionRange]:
    """The parts of `want` no row covers."""
    gaps, cursor = [], want.lo
    for r in sorted((_row_range(r) for r in rows), key=lambda x: x.lo or ()):
        part = VersionRange(cursor, r.lo).meet(want)
        if r.lo is not None and not part.empty and (cursor is None or cursor < r.lo):
            gaps.append(part)
        if r.hi is None:
            return gaps
        cursor = r.hi if cursor is None else max(cursor, r.hi)
    tail = VersionRange(cursor, None).meet(want)
    if not tail.empty:
        gaps.append(tail)
    return gaps


def edge_rows(kinds: tuple[str, ...], metric: str, decl: Declared) -> list[be.EdgeRow]:
    """The rows an SLI's threshold is checked against: for each selected kind the spec runs, its declared buckets
    or the table's rows of the declared versions. PluginOptionError where the declaration picks nothing or
    versions no row covers."""
    run = kinds
    if decl.versions:
        run = tuple(k for k in kinds if k in decl.versions)
        if not run:
            raise PluginOptionError(f"option {VERSIONS_OPTION!r} names {', '.join(decl.versions)}, none of which the "
                                    f"selector picks ({', '.join(kinds)})", VERSIONS_OPTION,
                                    "name the engines this SLI's selector measures")
    for kind in decl.buckets:
        if kind and kind not in run:
            raise PluginOptionError(f"option {BUCKETS_OPTION!r} names {kind}, which this SLI does not measure "
                                    f"({', '.join(run)})", BUCKETS_OPTION, f"remove {kind}'s buckets or select it")
    out: list[be.EdgeRow] = []
    for kind in run:
        custom = decl.buckets.get(kind, decl.buckets.get(""))
        if custom is not None:
            out.append(be.EdgeRow(kind, "(custom buckets)", {metric: custom}, f"the spec's {BUCKETS_OPTION} option"))
            continue
        rows = be.rows([kind], metric)
        want = decl.versions.get(kind)
        if want is None or want == VersionRange():
            out.extend(rows)
            continue
        every = be.rows([kind])
        gaps = _gaps(want, every)
        if gaps:
            known = "; ".join(f"{r.label} ({_row_range(r).describe()})" for r in every)
            raise PluginOptionError(f"option {VERSIONS_OPTION!r}: no bucket table covers {kind} "
                                    f"{', '.join(g.describe() for g in gaps)} (releases nobody checked)",
                                    VERSIONS_OPTION, f"narrow {kind}'s versions to those the table knows ({known}), or "
                                    f"declare the buckets it runs with: {BUCKETS_OPTION}: \"{kind}: 0.5, 1, 5\"")
        out.extend(r for r in rows if not _row_range(r).meet(want).empty)
    return out
