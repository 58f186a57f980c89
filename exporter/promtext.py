"""Prometheus text-format (0.0.4) parser with prometheus_client's semantics at a fraction of its cost.

WHY: the exporter parses every engine page on every cycle, and prometheus_client's parser runs at a few MB/s
(a node with 8 engines and many LoRA adapters pays that each cycle). This parser gives the same families as
`prometheus_client.parser.text_string_to_metric_families` (family naming, grouping, escapes, NaN/Inf,
timestamps in seconds) but:

* skips families outside `want` after a set lookup of the line's name, before any label or value parsing;
* takes a fast path for the common line shape (plain metric name, strict label set, one value) and falls back
  to an exact, character-level parse for anything else;
* caches parsed label strings across lines and pages (bounded), since engines repeat them on every scrape;
* never raises on a bad line: it skips the line and counts it (`ParsedPage.errors`).

`parse_page` is the one entry (the collector's, the tap gate's, the tests'): with `checked=True` it also leaves
out, and counts, what an adapter must never see (a NaN or +-Inf value, a second value for a series already on
the page), and with `family_limit` it stops reading a family after that many samples: the rest of its lines
are counted after a set lookup of their name, never parsed, so a page flooded with one family's series costs
little. The character-level parse of unusual lines and comments is in exporter/promtext_exact.py.

Where the two parsers differ, on purpose:

* prometheus_client yields one family per run of lines, so a name can come out several times (every untyped
  sample is its own family). Here the result is a dict: later runs of the same family name append their
  samples to the first one, which keeps its type and help.
* An OpenMetrics exemplar after the value (`... 1.0 # {trace_id="x"} 1.0 123`: everything from the `#`) is
  ignored. prometheus_client would take the exemplar's last token as the sample's timestamp. `# EOF` is a
  comment to both.
* A sample name that is not a valid metric name (`foo-bar{a="b"} 1`), a line with no whitespace at all, or an
  empty `__name__` is an error here; prometheus_client accepts some of those.
* Lines of families outside `want` are skipped unread, so a malformed one there is not counted.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Collection, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import chain

from exporter.model import MetricFamily, Sample
from exporter.promtext_exact import (
    ASCII_WS,
    LABEL_ESCAPE_RE,
    NAME_RE,
    parse_comment_exact,
    parse_sample_exact,
    parse_value_and_timestamp,
    unescape_match,
)

__all__ = ["ParsedPage", "clear_label_cache", "parse_page"]

_METRIC_TYPES = frozenset({"counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset"})
_NO_NAMES: AbstractSet[str] = frozenset()
_UNLIMITED = sys.maxsize
_BLOCK_CHARS = 1 << 20  # lines are split from blocks of about this size

# Engines repeat the same label sets on every scrape, so label strings parsed on earlier pages are reused:
# label string -> labels (never handed out: samples get copies). Both are bounded: at the limit they start over.
_LABEL_CACHE: dict[str, dict[str, str]] = {}
_GOOD_LABEL_NAMES: set[str] = set()  # label names already validated
_CACHE_LIMIT = 1 << 14  # entries; at most a few MB
_NO_LABELS: dict[str, str] = {}
_SUFFIXES = {"histogram": ("_count", "_sum", "_bucket"), "summary": ("_count", "_sum", "")}  # else ("",)
_SAMPLE_NAMES: dict[tuple[str, str], frozenset[str]] = {}  # (family, type) -> its sample names

_LABEL_NAME = r"(?!__)[a-zA-Z_:][a-zA-Z0-9_:]*"  # `__`-prefixed names are reserved (and `__name__` is special)
_ESCAPED_VALUE = r'"(?:[^"\\]|\\.)*"'
_LABEL_NAME_RE = re.compile(_LABEL_NAME)
_ESCAPED_LABELS_RE = re.compile(rf"(?:{_LABEL_NAME}={_ESCAPED_VALUE},)*(?:{_LABEL_NAME}={_ESCAPED_VALUE})?", re.S)
# The same strict label set, matched in place on a line: group 1 is the label string, the match ends after `}`.
_LABELS_IN_LINE_RE = re.compile(rf"((?:{_LABEL_NAME}={_ESCAPED_VALUE},)*(?:{_LABEL_NAME}={_ESCAPED_VALUE})?)\}}", re.S)
_ESCAPED_PAIR_RE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)="((?:[^"\\]|\\.)*)"', re.S)

_HELP_ESCAPE_RE = re.compile(r"\\[\\n]")


@dataclass(slots=True)
class ParsedPage:
    """A parsed page and what was left out of it, by kind (each a number of sample lines)."""

    families: dict[str, MetricFamily]
    errors: int = 0  # lines that could not be parsed
    nonfinite: int = 0  # NaN or +-Inf values (checked): a value no adapter can use
    duplicates: int = 0  # a series already on the page, again (checked): its first value is kept
    over_limit: int = 0  # samples of a family beyond `family_limit`: counted, not parsed


def parse_page(
    text: str,
    want: Collection[str] | None = None,
    *,
    truncated: bool = False,
    checked: bool = False,
    family_limit: int | None = None,
) -> ParsedPage:
    """Parse an exposition page into families keyed by family name, keeping only `want` when given; bad lines
    are skipped and counted (`errors`), never raised.

    `truncated=True` says the caller stopped reading the page (a size cap), so a final line without its
    newline is a fragment: it is dropped and counted as an error instead of yielding a cut-off value.

    `checked=True`: a sample whose value is NaN or +-Inf is left out and counted (`nonfinite`), except a
    summary's quantiles, where NaN means "no observations in the window" (left out uncounted: an absent
    quantile says the same, and no adapter reads quantiles); a sample whose name and label text already
    appeared on the page is left out and counted (`duplicates`): the first value is kept, as Prometheus
    keeps the first sample of a series in one scrape.

    `family_limit`: at most that many samples of one family are kept; the rest are counted
    (`over_limit`) after a set lookup of their name, before any label or value is parsed.
    """
    wanted = None if want is None else want if isinstance(want, (set, frozenset)) else frozenset(want)
    page = _PageState(wanted, _UNLIMITED if family_limit is None else max(0, family_limit), checked)
    end = len(text)
    if truncated:
        cut = text.rfind("\n") + 1
        if text[cut:].strip():
            page.errors += 1
            end = cut
    # Lines are split a block at a time: a 16 MiB page never holds all its lines at once.
    _read_lines(page, chain.from_iterable(block.split("\n") for block in _blocks(text, end)))
    page.close()
    return ParsedPage(page.out, page.errors, page.nonfinite, page.duplicates, page.over)


class _PageState:
    """The parser's state between lines (prometheus_client's parser state): the open family and the counts.

    Name "" means no family is open: its samples go nowhere. `fam` is built only for a family that can
    survive `want` (`keep`); others are tracked by name alone. The per-line loop (`_read_lines`) keeps the
    fields it reads on every sample in locals and writes `room` back before a comment or a foreign line.
    """

    __slots__ = (
        "wanted", "limit", "checked", "out", "taken", "seen", "errors", "nonfinite", "duplicates", "over",
        "fam_name", "plain", "fam", "append", "keep", "room", "allowed", "fast_allowed", "exempt",
    )

    def __init__(self, wanted: frozenset[str] | set[str] | None, limit: int, checked: bool) -> None:
        self.wanted = wanted
        self.limit = limit
        self.checked = checked
        self.out: dict[str, MetricFamily] = {}
        self.taken: dict[str, int] = {}  # family name as the page spells it -> samples kept in its earlier runs
        self.seen: set[tuple[str, object]] = set()  # (sample name, label key) of every sample kept (checked)
        self.errors = self.nonfinite = self.duplicates = self.over = 0
        self.fam_name = ""
        self.plain = False  # the open family's name is a plain metric name
        self.fam: MetricFamily | None = None
        self.append: Callable[[Sample], None] | None = None
        self.keep = False
        self.room = 0  # samples the open family may still keep (family_limit)
        self.allowed: AbstractSet[str] = _NO_NAMES  # sample names that belong to the open family
        self.fast_allowed: AbstractSet[str] = _NO_NAMES  # the same, when plain names the fast path may trust
        self.exempt: AbstractSet[str] = _NO_NAMES  # sample names whose non-finite values are legitimate (quantiles)

    def may_keep(self, name: str) -> bool:
        wanted = self.wanted
        return wanted is None or name in wanted or (name[-6:] == "_total" and name[:-6] in wanted)

    def close(self) -> None:
        """Close the open family: its samples go into the result (or nowhere, when `want` rules it out)."""
        if self.keep:
            self.taken[self.fam_name] = self.limit - self.room
            self.over += _emit(self.out, self.fam, self.wanted, self.limit)  # type: ignore[arg-type]
        self.fam_name = ""
        self.fam = self.append = None
        self.keep = False
        self.allowed = self.fast_allowed = self.exempt = _NO_NAMES

    def comment(self, line: str) -> None:
        """A `#` line: HELP and TYPE of another name switch families (here, once for both), other comments
        are ignored."""
        # Fast path: `# HELP name text` / `# TYPE name type` with single spaces around a plain name. The name
        # of a family that `want` rules out is not validated: nothing of it is kept.
        head = line[:7]
        kind = ""
        arg: str | None
        may_keep = False
        if head == "# HELP " or head == "# TYPE ":
            name, _, arg = line[7:].partition(" ")
            if not name or name[0] == '"' or not name.isprintable():
                pass  # quoted name, or a tab after it: the exact path splits it
            elif name == self.fam_name:
                kind = head[2:6]
            else:
                wanted = self.wanted
                may_keep = wanted is None or name in wanted or (name[-6:] == "_total" and name[:-6] in wanted)
                if not may_keep or NAME_RE.fullmatch(name) is not None:
                    kind = head[2:6]
                    self.plain = True
        if not kind:
            try:
                comment = parse_comment_exact(line)
            except ValueError:
                self.errors += 1
                return
            if comment is None:
                return
            kind, name, arg = comment
            self.plain = NAME_RE.fullmatch(name) is not None
            may_keep = self.may_keep(name)
        typ = ""
        if kind == "TYPE":
            typ = arg.lstrip(ASCII_WS)  # type: ignore[union-attr]
            if typ == "untyped":
                typ = "unknown"
            if typ not in _METRIC_TYPES:
                self.errors += 1
                return
        if name != self.fam_name:  # the family switch: close the open family, open this one
            if self.keep:
                self.taken[self.fam_name] = self.limit - self.room
                self.over += _emit(self.out, self.fam, self.wanted, self.limit)  # type: ignore[arg-type]
            self.fam_name = name
            self.keep = may_keep
            if may_keep:
                fam = self.fam = MetricFamily(name, "unknown")
                self.append = fam.samples.append
                self.room = self.limit - self.taken.get(name, 0)
            else:
                self.fam = self.append = None
            self.exempt = _NO_NAMES
            if not typ:
                allowed = self.allowed = _sample_names(name, "")
                self.fast_allowed = allowed if self.plain else _NO_NAMES
        if not typ:  # HELP
            if self.keep:
                self.fam.help = _help_text(arg)  # type: ignore[union-attr]
            return
        if self.keep:
            self.fam.type = typ  # type: ignore[union-attr]
        allowed = self.allowed = _sample_names(name, typ)
        self.fast_allowed = allowed if self.plain else _NO_NAMES
        self.exempt = {name} if typ == "summary" else _NO_NAMES

    def add_line(self, line: str, exempt: AbstractSet[str]) -> None:
        """A sample line of the open family that the fast path cannot read: parsed exactly, then kept."""
        try:
            sample = _parse_sample(line)
        except ValueError:
            self.errors += 1
            return
        self.add(sample, exempt)

    def add(self, sample: Sample, exempt: AbstractSet[str]) -> None:
        """Keep a sample parsed the slow way in the open family (after the checks, when checked)."""
        if self.checked and self.refused(sample, exempt):
            return
        self.append(sample)  # type: ignore[misc]
        self.room -= 1

    def refused(self, sample: Sample, exempt: AbstractSet[str]) -> bool:
        """A checked parse leaves a sample parsed the slow way out (a non-finite value, counted unless its family
        is `exempt`; a duplicate of a kept one, counted) or keeps it (and remembers it): the fast path's checks."""
        if sample.value - sample.value:  # NaN or +-Inf
            self.nonfinite += sample.name not in exempt
            return True
        key = (sample.name, _label_key(sample.labels))
        if key in self.seen:
            self.duplicates += 1
            return True
        self.seen.add(key)
        return False

    def foreign(self, line: str, name: str, brace: int) -> None:
        """A sample line not of the open family: prometheus_client closes it and makes the line a family of its own."""
        sample = None
        if not _is_plain_sample_name(line, name, brace):
            try:
                sample = _parse_sample(line)
            except ValueError:
                self.errors += 1
                return
            name = sample.name
            if name in self.allowed:  # a sample of the open family after all (an unusual spelling)
                if not self.keep:
                    return
                if self.room <= 0:
                    self.over += 1
                    return
                self.add(sample, self.exempt)
                return
        wanted_name = self.wanted is None or name in self.wanted
        untyped = name + "{"  # its key in `taken`: apart from a typed family of the same name
        if wanted_name and self.taken.get(untyped, 0) >= self.limit:  # an untyped family at its limit: closes, keeps nothing
            self.over += 1
            sample = None
        elif sample is None and wanted_name:
            try:
                sample = _parse_sample(line)
            except ValueError:  # a bad line is skipped as if absent: it closes nothing
                self.errors += 1
                return
        self.close()
        if sample is None or not wanted_name:
            return
        if self.checked and self.refused(sample, _NO_NAMES):
            return
        self.taken[untyped] = self.taken.get(untyped, 0) + 1
        self.over += _emit(self.out, MetricFamily(name, "unknown", "", [sample]), self.wanted, self.limit)


def _read_lines(page: _PageState, lines: Iterator[str]) -> None:
    """Every line into `page`. A sample of the open family with a plain name is read here, inline: the hot path."""
    label_cache = _LABEL_CACHE
    checked, seen = page.checked, page.seen
    errors = nonfinite = duplicates = over = 0
    keep, room, append, fast_allowed, exempt = False, 0, None, _NO_NAMES, _NO_NAMES
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if line[0] == "#":  # HELP and TYPE switch families
            page.room = room
            page.comment(line)
            keep, room, append, fast_allowed, exempt = page.keep, page.room, page.append, page.fast_allowed, page.exempt
            continue
        # A sample. The name is whatever precedes `{`, or the first space when there are no labels.
        brace = line.find("{")
        name = line[:brace] if brace > 0 else line.partition(" ")[0]
        if name not in fast_allowed:  # not (plainly) of the open family: its own family, or an unusual spelling
            page.room = room
            page.foreign(line, name, brace)
            keep, room, append, fast_allowed, exempt = page.keep, page.room, page.append, page.fast_allowed, page.exempt
            continue
        if not keep:
            continue
        if room <= 0:  # the family's limit is reached: count the line, read nothing of it
            over += 1
            continue
        if brace > 0:
            end = line.find("}", brace)
            labels = None
            if end > 0:
                # A strict label set (or one seen before on this page) has balanced quotes, so the first `}`
                # really closes it.
                label_text = line[brace + 1 : end]
                labels = label_cache.get(label_text)
                if labels is None:
                    try:
                        labels = _new_labels(label_text)
                    except ValueError:
                        errors += 1
                        continue
            if labels is None:  # the exact parse
                page.room = room
                page.add_line(line, exempt)
                room = page.room
                continue
            value_text = line[end + 1 :]
        else:
            labels = _NO_LABELS
            label_text = ""
            value_text = line[len(name) + 1 :]
        try:  # float() skips the leading whitespace, as the text format does
            if "_" in value_text:
                raise ValueError(value_text)
            value = float(value_text)
            timestamp = None
        except ValueError:
            try:  # a timestamp, an exemplar, tabs, or an error
                value, timestamp = parse_value_and_timestamp(value_text)
            except ValueError:
                errors += 1
                continue
        if checked:
            if value - value:  # NaN or +-Inf (a finite value minus itself is 0)
                nonfinite += name not in exempt
                continue
            key = (name, label_text)
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
        append(Sample(name, labels.copy(), value, timestamp))  # type: ignore[misc]
        room -= 1
    page.room = room
    page.errors += errors
    page.nonfinite += nonfinite
    page.duplicates += duplicates
    page.over += over


def _sample_names(name: str, typ: str) -> frozenset[str]:
    """The sample names of a family of this name and type; made once per family (engines repeat their pages)."""
    key = (name, typ)
    names = _SAMPLE_NAMES.get(key)
    if names is None:
        if len(_SAMPLE_NAMES) >= _CACHE_LIMIT:
            _SAMPLE_NAMES.clear()
        names = _SAMPLE_NAMES[key] = frozenset(name + suffix for suffix in _SUFFIXES.get(typ, ("",)))
    return names


def _blocks(text: str, end: int) -> Iterator[str]:
    """`text[:end]` in pieces of about _BLOCK_CHARS that end at line ends (the text itself when small)."""
    if end <= _BLOCK_CHARS:
        yield text if end == len(text) else text[:end]
        return
    start = 0
    while start < end:
        stop = text.find("\n", start + _BLOCK_CHARS, end)
        if stop < 0:
            yield text[start:end]
            return
        yield text[start:stop]
        start = stop + 1


def _label_key(labels: dict[str, str]) -> str:
    """The strict label text of a label set, as the fast path sees it (`a="1",b="x\\\\"y"`): the duplicate key."""
    return ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())


def _escape_label(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def clear_label_cache() -> None:
    """Forget the label strings parsed so far, so the next parse is a first one (for benchmarks and tests)."""
    _LABEL_CACHE.clear()
    _GOOD_LABEL_NAMES.clear()
    _SAMPLE_NAMES.clear()


def _help_text(arg: str | None) -> str:
    """The HELP text after the name: leading whitespace skipped, `\\\\` and `\\n` unescaped."""
    if not arg:
        return ""
    arg = arg.lstrip(ASCII_WS)
    return _HELP_ESCAPE_RE.sub(unescape_match, arg) if "\\" in arg else arg


def _emit(out: dict[str, MetricFamily], fam: MetricFamily, wanted: frozenset[str] | set[str] | None,
          limit: int = _UNLIMITED) -> int:
    """Close a family: apply prometheus_client's counter naming, filter by `wanted`, merge repeats by name.

    A repeat is merged up to `limit` samples in all; returns how many it brought beyond that (left out).
    """
    name = fam.name
    if not name:
        return 0
    if fam.type == "counter":
        if name.endswith("_total"):
            name = fam.name = name[:-6]
        else:
            total = name + "_total"
            for sample in fam.samples:
                sample.name = total
    if wanted is not None and name not in wanted:
        return 0
    first = out.get(name)
    if first is None:
        out[name] = fam
        return 0
    samples = fam.samples
    room = max(0, limit - len(first.samples))
    if len(samples) <= room:
        first.samples.extend(samples)
        return 0
    first.samples.extend(samples[:room])
    return len(samples) - room


def _is_plain_sample_name(line: str, name: str, brace: int) -> bool:
    """Whether `name`, cut from `line` by the fast rule, is exactly the name prometheus_client would read."""
    if not name or NAME_RE.fullmatch(name) is None:
        return False
    return brace > 0 or line[len(name) : len(name) + 1] == " "


# --------------------------------------------------------------------------------------------------------
# One sample line, in full
# --------------------------------------------------------------------------------------------------------
def _parse_sample(line: str) -> Sample:
    """Parse a stripped sample line; raise ValueError when it is malformed.

    The strict shape (`name{a="1",b="2"} value [timestamp]`) is matched with regular expressions; anything
    else (spaces around labels, quoted names, `__name__`, tabs) goes through the character-level parser.
    """
    brace = line.find("{")
    if brace > 0 and NAME_RE.fullmatch(line, 0, brace) is not None:
        match = _LABELS_IN_LINE_RE.match(line, brace + 1)
        if match is not None:
            labels = _LABEL_CACHE.get(match.group(1)) or _new_labels(match.group(1))
            if labels is not None:
                value, timestamp = parse_value_and_timestamp(line[match.end() :])
                return Sample(line[:brace], labels.copy(), value, timestamp)
    elif brace < 0 or " # " in line[:brace]:
        match = NAME_RE.match(line)
        if match is not None and line[match.end() : match.end() + 1] in (" ", "\t"):
            end = match.end()
            value, timestamp = parse_value_and_timestamp(line[end + 1 :])
            return Sample(line[:end], {}, value, timestamp)
    return parse_sample_exact(line)


def _new_labels(text: str) -> dict[str, str] | None:
    """Labels from a strict label string not in the cache (then cached); None if it is not strict.

    A histogram bucket's label string differs from its neighbours' only in `le`, so the text around the `le`
    pair is parsed (and cached) on its own and the bucket's labels are put together from it, in order.
    Raises ValueError on a repeated label name.
    """
    labels = None
    at = text.find('le="')
    if at >= 0 and (at == 0 or text[at - 1] == ",") and "\\" not in text:
        close = text.find('"', at + 4)
        after = text[close + 1 : close + 2]
        if close > 0 and (after == "," or not after):
            head, tail = text[:at], text[close + 2 :]
            head_labels = _LABEL_CACHE.get(head) if head else _NO_LABELS
            if head_labels is None:
                head_labels = _new_labels(head)
            tail_labels = _LABEL_CACHE.get(tail) if tail else _NO_LABELS
            if tail_labels is None:
                tail_labels = _new_labels(tail)
            if head_labels is not None and tail_labels is not None:
                if "le" in head_labels or "le" in tail_labels:
                    raise ValueError(f"duplicate label name in {{{text}}}")
                labels = {**head_labels, "le": text[at + 4 : close], **tail_labels}
    if labels is None:
        labels = _parse_strict_labels(text)
        if labels is None:
            return None
    if len(_LABEL_CACHE) >= _CACHE_LIMIT:
        _LABEL_CACHE.clear()
    _LABEL_CACHE[text] = labels
    return labels


def _parse_strict_labels(text: str) -> dict[str, str] | None:
    """Labels from a strict `a="1",b="2"` string (a trailing comma allowed); None if it is not that shape.

    Raises ValueError on a repeated label name.
    """
    if "\\" in text:
        if _ESCAPED_LABELS_RE.fullmatch(text) is None:
            return None
        pairs = _ESCAPED_PAIR_RE.findall(text)
        labels = {k: LABEL_ESCAPE_RE.sub(unescape_match, v) if "\\" in v else v for k, v in pairs}
        count = len(pairs)
    else:
        # Without backslashes every quote delimits a value, so splitting on `",` is exact once each part is
        # `name="value` with exactly one quote (the quote count proves that).
        if text[-1:] == ",":
            text = text[:-1]
        if not text:
            return {}
        if text[-1] != '"':
            return None
        parts = text[:-1].split('",')
        count = len(parts)
        if text.count('"') != 2 * count:
            return None
        labels = {}
        for part in parts:
            name, sep, value = part.partition('="')
            if not sep:
                return None
            if name not in _GOOD_LABEL_NAMES:
                if _LABEL_NAME_RE.fullmatch(name) is None:
                    return None
                if len(_GOOD_LABEL_NAMES) >= _CACHE_LIMIT:
                    _GOOD_LABEL_NAMES.clear()
                _GOOD_LABEL_NAMES.add(name)
            labels[name] = value
    if len(labels) != count:
        raise ValueError(f"duplicate label name in {{{text}}}")
    return labels
