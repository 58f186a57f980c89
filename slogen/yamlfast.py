"""A block-style YAML writer for the plain trees slogen dumps, byte for byte what PyYAML's emitter writes.

Why: a 1,000-SLO build writes about 120 MB of YAML (rules and their promtool tests). Through PyYAML's
node graph even libyaml's emitter spends most of its time in Python callbacks (2 µs a node, 5 million
nodes). This writer lays out the structure itself (PyYAML's layout for `default_flow_style=False`,
indent 2, no line folding: `key: value`, sequences in a mapping not indented, `- ` items with their
first key on the dash's line, `{}` and `[]` for empty collections) and asks PyYAML once per distinct
scalar how it writes it (plain, quoted, or a literal block, whose lines it then indents as PyYAML does).

It writes only dicts, lists, strings, ints, floats, bools and None, with string keys PyYAML writes as
simple keys; `write` returns None for anything else (a sequence directly in a sequence, a literal
block with a kept final line break, another type), and the caller then uses PyYAML.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import yaml

_OTHER_BREAKS = re.compile("[\x85\u2028\u2029]")
_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = yaml.resolver.Resolver()
_IMPLICIT_FIRST = frozenset(k for k in yaml.resolver.Resolver.yaml_implicit_resolvers if k)  # may read as non-str
_SIMPLE_KEY_MAX = 128  # PyYAML writes longer keys as complex (`? `) keys

_VALUE_CACHE: dict[str, tuple[str, tuple[str, ...]] | None] = {}  # str -> (head, literal lines) or None
_KEY_CACHE: dict[str, str | None] = {}
_CACHE_LIMIT = 1 << 17


class _Unsupported(Exception):
    pass


_CACHED_MAX = 4096  # characters: rule expressions and labels repeat; a dashboard's JSON (100 KB) does not


def _remember(cache: dict, key: str, value: Any) -> Any:
    """Keep `value` for the next time `key` is written. Long texts are not kept: the cache held every
    dashboard's JSON twice (the key and its lines), 370 MB of a 3,000-SLO build's dashboard ConfigMaps."""
    if len(key) > _CACHED_MAX:
        return value
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def _line(s: str) -> str | None:
    """How PyYAML writes a one-line ASCII string as a block value: plain when its emitter allows it and no
    implicit resolver reads it as another type, else single-quoted (its analysis always allows that for
    such text); None for other text (ask PyYAML). Mirrors Emitter.analyze_scalar for this subset."""
    if not s:
        return "''"
    if not (s.isascii() and s.isprintable()):
        return None  # tabs, control characters, non-ASCII: PyYAML decides
    plain = s[0] != " " and s[-1] != " " and not s.startswith(("---", "..."))
    if plain:
        first, after = s[0], s[1:2]
        if first in "#,[]{}&*!|>'\"%@`":
            plain = False
        elif first in "?:-" and (after == "" or after == " "):
            plain = False
        elif ": " in s or s.endswith(":") or " #" in s:
            plain = False
    if plain and (s[0] not in _IMPLICIT_FIRST or _RESOLVER.resolve(yaml.ScalarNode, s, (True, False)) == _STR_TAG):
        return s
    return "'" + s.replace("'", "''") + "'"


def _literal(s: str) -> tuple[str, tuple[str, ...]] | None:
    """A multi-line string as PyYAML writes it (style `|`), decided without it for ASCII text without
    trailing spaces on any line, not starting with a space or a line break, and not ending in two breaks."""
    if not s or s[0] in " \n" or s.endswith(" ") or " \n" in s or s.endswith("\n\n"):
        return None
    if not s.isascii() or not s.replace("\n", "").isprintable():
        return None
    if s.endswith("\n"):
        return "|", tuple(s[:-1].split("\n"))
    return "|-", tuple(s.split("\n"))


def _value_text(s: str, dump: Callable[[Any], str]) -> tuple[str, tuple[str, ...]] | None:
    """How PyYAML writes `s` as a block value or item: its first line, and a literal block's lines."""
    if "\n" in s:
        found = _literal(s)
        if found is not None:
            return found
    else:
        line = _line(s)
        if line is not None:
            return line, ()
    text = dump([s])  # "- X\n", or "- |\n  line\n  line\n" for a literal block
    if not text.startswith("- ") or not text.endswith("\n") or _OTHER_BREAKS.search(text):
        return None  # NEL and the Unicode separators break lines too, at an indentation of their own
    head, _, rest = text[2:].partition("\n")
    if not rest:
        return head, ()
    if not head.startswith("|") or "+" in head or text.endswith("...\n"):
        return None  # only literal blocks continue on further lines; a kept final break ends the document
    lines = rest[:-1].split("\n")
    if any(line and not line.startswith("  ") for line in lines):
        return None
    return head, tuple(line[2:] for line in lines)


def _key_text(s: str, dump: Callable[[Any], str]) -> str | None:
    """How PyYAML writes `s` as a simple mapping key; None when it writes a complex (`? `) key."""
    if 0 < len(s) < _SIMPLE_KEY_MAX and "\n" not in s:  # PyYAML writes an empty key as `? ''`
        line = _line(s)
        if line is not None:
            return line
    text = dump({s: None})
    if not text.endswith(": null\n") or text.startswith("? ") or _OTHER_BREAKS.search(text):
        return None
    key = text[: -len(": null\n")]
    return None if "\n" in key else key


def _float(x: float) -> str:
    """SafeRepresenter.represent_float's text."""
    if x != x:
        return ".nan"
    if x == math.inf:
        return ".inf"
    if x == -math.inf:
        return "-.inf"
    value = repr(x).lower()
    if "." not in value and "e" in value:
        value = value.replace("e", ".0e", 1)
    return value


def _scalar_writer(append: Callable[[str], None], dump: Callable[[Any], str]) -> Callable[[Any, int], None]:
    """The writer of one scalar for `write` (a closure over its output, as hot as an inline one)."""
    values = _VALUE_CACHE

    def scalar(value: Any, indent: int) -> None:
        """After `key:` or `-`: ` text\\n`, or a literal block's head and its lines at `indent`."""
        kind = type(value)
        if kind is str:
            found: Any = values.get(value, False)  # False: not seen yet (None: cannot be written fast)
            if found is False:
                found = _remember(values, value, _value_text(value, dump))
            if found is None:
                raise _Unsupported
            head, lines = found
            append(" " + head + "\n")
            if lines:
                pad = " " * indent
                append("".join((pad + line + "\n") if line else "\n" for line in lines))
        elif kind is int:
            append(f" {value}\n")
        elif kind is bool:
            append(" true\n" if value else " false\n")
        elif value is None:
            append(" null\n")
        elif kind is float:
            append(" " + _float(value) + "\n")
        else:
            raise _Unsupported

    return scalar


def write(obj: Any, dump: Callable[[Any], str]) -> str | None:
    """`obj` as PyYAML writes it (`dump` is that writer, asked once per distinct string); None: not this writer's."""
    if not isinstance(obj, (dict, list)) or not obj:
        return None
    out: list[str] = []
    append = out.append
    keys = _KEY_CACHE

    scalar = _scalar_writer(append, dump)
    # A mapping written again (the same object: the generated tests list one expected alert at many steps) is
    # the text it made the first time at that place: id -> (indent, first piece, end piece) of `out`, then its text.
    # The tree is alive and unchanged while it is written, so an id names one object throughout.
    written: dict[int, tuple[int, int, int]] = {}
    repeated: dict[tuple[int, int], str] = {}

    def item_mapping(m: dict, indent: int) -> None:
        """A mapping that is a sequence's item (first key on the dash's line)."""
        key = (id(m), indent)
        text = repeated.get(key)
        if text is not None:
            append(text)
            return
        first = written.get(id(m))
        if first is not None and first[0] == indent:
            text = repeated[key] = "".join(out[first[1]:first[2]])
            append(text)
            return
        start = len(out)
        mapping(m, indent, True)
        written[id(m)] = (indent, start, len(out))

    def mapping(m: dict, indent: int, first_inline: bool) -> None:
        pad = " " * indent
        for i, (k, v) in enumerate(m.items()):
            if type(k) is not str:
                raise _Unsupported
            key: Any = keys.get(k, False)
            if key is False:
                key = _remember(keys, k, _key_text(k, dump))
            if key is None:
                raise _Unsupported
            append((key if first_inline and i == 0 else pad + key) + ":")
            node(v, indent, in_mapping=True)

    def node(v: Any, indent: int, in_mapping: bool) -> None:
        """A value after `key:` (in_mapping) or after `-`; `indent` is the key's or the dash's column."""
        if isinstance(v, dict):
            if not v:
                append(" {}\n")
            elif in_mapping:
                append("\n")
                mapping(v, indent + 2, False)
            else:
                append(" ")
                item_mapping(v, indent + 2)
        elif isinstance(v, list):
            if not v:
                append(" []\n")
            elif in_mapping:
                append("\n")
                sequence(v, indent)  # PyYAML does not indent a sequence inside a mapping
            else:
                raise _Unsupported  # a sequence right inside a sequence: rare, left to PyYAML
        else:
            scalar(v, indent + 2)

    def sequence(s: list, indent: int) -> None:
        pad = " " * indent
        for item in s:
            append(pad + "-")
            node(item, indent, in_mapping=False)

    try:
        if isinstance(obj, dict):
            mapping(obj, 0, False)
        else:
            sequence(obj, 0)
    except _Unsupported:
        return None
    return "".join(out)
