"""The character-level half of the exposition parser (exporter/promtext.py): what its fast path does not read.

A sample line of an unusual shape (spaces around labels, quoted names, `__name__`, tabs), a value with a
timestamp or an exemplar, a HELP or TYPE comment that is not `# HELP name text` with single spaces, and the
quoting and escapes they use, each by prometheus_client's rules for where names, labels and values end.
Each raises ValueError on a malformed line; the parser counts it and goes on.
"""

from __future__ import annotations

import re

from exporter.model import Sample

# What prometheus_client splits comment tokens on (string.whitespace); `str.strip()` is wider on purpose:
# the reference strips whole lines with it too.
ASCII_WS = " \t\n\r\x0b\x0c"
NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_ESCAPE_RE = re.compile(r'\\[\\n"]')
_UNESCAPE = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


def parse_sample_exact(line: str) -> Sample:
    """The character-level parse, following prometheus_client's rules for where names, labels and values end."""
    brace = _find_unquoted(line, "{")
    if brace < 0 or " # " in line[:brace]:
        name_end = _find_unquoted(line, " \t")
        if name_end < 0:
            raise ValueError(f"no value in line: {line!r}")
        name = line[:name_end]
        if NAME_RE.fullmatch(name) is None:
            raise ValueError(f"invalid metric name in line: {line!r}")
        value, timestamp = parse_value_and_timestamp(line[name_end + 1 :])
        return Sample(name, {}, value, timestamp)
    name = line[:brace].strip()
    close = _find_unquoted(line, "}", brace)
    if close < 0:
        raise ValueError(f"unclosed labels in line: {line!r}")
    labels = _parse_labels_exact(line[brace + 1 : close])
    if not name:
        name = labels.pop("__name__", "")
        if not name:
            raise ValueError(f"no metric name in line: {line!r}")
    elif "__name__" in labels:
        raise ValueError(f"metric name given twice in line: {line!r}")
    elif NAME_RE.fullmatch(name) is None:
        raise ValueError(f"invalid metric name in line: {line!r}")
    value, timestamp = parse_value_and_timestamp(line[close + 1 :])
    return Sample(name, labels, value, timestamp)


def _parse_labels_exact(text: str) -> dict[str, str]:
    """Labels between the braces, with prometheus_client's leniency (spaces, stray commas, quoted names)."""
    labels: dict[str, str] = {}
    rest = text.strip()
    while rest:
        start = rest
        if rest[0] == ",":
            rest = rest[1:]
            if not rest:
                break
            if rest[0] == ",":
                raise ValueError(f"repeated comma in labels {{{text}}}")
        pos = _find_unquoted(rest, "=,}")
        if pos >= 0 and rest[pos] == "=":
            raw_name = rest[:pos]
            rest = rest[pos + 1 :]
            pos = _find_unquoted(rest, ",}")
        else:
            raw_name = "__name__"  # a bare quoted term is the metric name: {"my.metric", a="1"}
        if pos < 0:
            pos = len(rest)
        term = rest[:pos].strip()
        remainder = rest[pos:].strip()
        if remainder == start:
            raise ValueError(f"malformed labels {{{text}}}")
        rest = remainder
        if not term:
            continue
        label_name, quoted = _unquote(raw_name)
        if not quoted and NAME_RE.fullmatch(label_name) is None:
            raise ValueError(f"invalid label name {label_name!r}")
        if term[0] != '"' or _closing_quote(term) != len(term) - 1:
            raise ValueError(f"label value not quoted: {term!r}")
        value, _ = _unquote(term)
        if label_name != "__name__" and label_name.startswith("__"):
            raise ValueError(f"reserved label name {label_name!r}")
        if label_name in labels:
            raise ValueError(f"duplicate label name {label_name!r}")
        labels[label_name] = value
    return labels


def parse_value_and_timestamp(text: str) -> tuple[float, float | None]:
    """The value and optional timestamp (milliseconds in the text, seconds out) after the name and labels.

    An OpenMetrics exemplar (`# {...} value [timestamp]`) is dropped first. The rest is split like
    prometheus_client does: on spaces, or on tabs when there are no spaces, and the last token is the timestamp.
    """
    exemplar = text.find("#")
    text = text[:exemplar].strip() if exemplar >= 0 else text.lstrip()
    separator = " " if " " in text else "\t"
    tokens = [t for t in (tok.strip() for tok in text.split(separator)) if t]
    if not tokens:
        raise ValueError(f"no value in {text!r}")
    value = _number(tokens[0])
    if len(tokens) == 1:
        return value, None
    stamp = tokens[-1]
    if "_" in stamp:
        raise ValueError(f"invalid timestamp {stamp!r}")
    try:
        return value, int(stamp) / 1000
    except ValueError:
        return value, float(stamp) / 1000


def _number(token: str) -> float:
    if "_" in token:  # Python's float() accepts 1_000; the text format does not
        raise ValueError(f"invalid value {token!r}")
    return float(token)


# --------------------------------------------------------------------------------------------------------
# Comments
# --------------------------------------------------------------------------------------------------------
def parse_comment_exact(line: str) -> tuple[str, str, str | None] | None:
    """(HELP|TYPE, name, rest) for a HELP or TYPE line, None for any other comment; ValueError if malformed."""
    parts = _split_comment(line)
    if len(parts) < 2:
        return None
    kind = parts[1]
    if kind != "HELP" and kind != "TYPE":
        return None
    name = ""
    if len(parts) > 2:
        name, quoted = _unquote(parts[2])
        if not quoted and NAME_RE.fullmatch(name) is None:
            raise ValueError(f"invalid metric name in comment: {line!r}")
    arg = parts[3] if len(parts) == 4 else None
    if kind == "TYPE" and arg is None:
        raise ValueError(f"TYPE line without a type: {line!r}")
    return kind, name, arg


def _split_comment(line: str) -> list[str]:
    """Up to four tokens split on unquoted ASCII whitespace; the fourth is the rest of the line."""
    tokens: list[str] = []
    i, n = 0, len(line)
    while i < n:
        if line[i] in ASCII_WS:
            i += 1
            continue
        if len(tokens) == 3:
            tokens.append(line[i:])
            break
        j = _find_unquoted(line, ASCII_WS, i)
        if j < 0:
            tokens.append(line[i:])
            break
        tokens.append(line[i:j])
        i = j
    return tokens


# --------------------------------------------------------------------------------------------------------
# Quoting
# --------------------------------------------------------------------------------------------------------
def _find_unquoted(text: str, chars: str, start: int = 0) -> int:
    """Index of the first of `chars` at or after `start` that is outside double quotes, or -1."""
    in_quotes = False
    for i in range(start, len(text)):
        c = text[i]
        if c == '"':
            if not _is_escaped(text, i):
                in_quotes = not in_quotes
        elif not in_quotes and c in chars:
            return i
    return -1


def _is_escaped(text: str, pos: int) -> bool:
    backslashes = 0
    while pos > backslashes and text[pos - 1 - backslashes] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _closing_quote(term: str) -> int:
    """Index of the first unescaped `"` after the opening one, or -1."""
    i = term.find('"', 1)
    while i >= 0 and _is_escaped(term, i):
        i = term.find('"', i + 1)
    return i


def _unquote(text: str) -> tuple[str, bool]:
    """Strip surrounding quotes (if any) and label escapes; say whether it was quoted."""
    text = text.strip()
    if not text:
        return text, False
    quoted = text[0] == '"'
    if quoted:
        if len(text) == 1 or text[-1] != '"':
            raise ValueError(f"missing closing quote: {text!r}")
        text = text[1:-1]
    if "\\" in text:
        text = LABEL_ESCAPE_RE.sub(unescape_match, text)
    return text, quoted


def unescape_match(match: re.Match[str]) -> str:
    return _UNESCAPE[match.group(0)]
