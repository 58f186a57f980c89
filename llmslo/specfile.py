"""Reading SLO spec files: one strict YAML reader for slogen and the goodput tap.

slogen (every loader: Sloth, the CRD, OpenSLO, AlertWindows, autoscaling specs) and the tap
(`exporter.tap.classes`) read the same files through this module, so they accept and refuse
exactly the same inputs. On top of PyYAML's safe loader it refuses what YAML would otherwise
let through silently or turn into a traceback:

* bytes that are not UTF-8: the message gives the byte offset, line and column of the bad sequence;
* a mapping key given twice (YAML keeps the last value without a word): the line of the second, and of the first;
* nesting deeper than MAX_DEPTH collections (PyYAML's composer recurses once per level and a deep
  enough document ends in RecursionError), and aliases that contain themselves;
* keys that are mappings or lists (a TypeError in a plain dict).

Mappings and sequences come back as LineDict / LineList, which remember the line they start
on (and each key's line), so callers' errors can point at the field.

Speed: where PyYAML has libyaml, a file is parsed and composed in C (about 10x faster: slogen reads
every spec of a 1,000-SLO catalog in tens of milliseconds), after a scan of its C parse events for
the nesting and alias limits; the constructors (line numbers, duplicate keys) are the same Python
ones. A file the C path cannot read is read again by the pure-Python loader, so every error keeps
PyYAML's wording, line and column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import yaml
from yaml.events import AliasEvent, MappingEndEvent, MappingStartEvent, SequenceEndEvent, SequenceStartEvent

from llmslo.problems import describe

MAX_DEPTH = 64  # nested mappings/sequences; a real spec uses fewer than 10
SUFFIXES = (".yaml", ".yml")
_MERGE_TAG = "tag:yaml.org,2002:merge"


class SpecFileError(ValueError):
    """A file that cannot be read as a spec at all. `str()` reads `FILE:LINE: problem (fix: ...)`."""

    def __init__(self, file: str, message: str, *, line: int | None = None, column: int | None = None,
                 fix: str = ""):
        self.file, self.message, self.line, self.column, self.fix = file, message, line, column, fix
        super().__init__(str(self))

    def __str__(self) -> str:
        return describe(self.file, self.message, line=self.line, fix=self.fix)


class LineDict(dict):
    """A mapping that remembers the line it starts on and the line of each key."""

    line: int | None = None
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int | None:
        return getattr(self, "key_lines", {}).get(key, self.line)


class LineList(list):
    line: int | None = None


class _Refused(yaml.MarkedYAMLError):
    """A document this reader refuses (duplicate key, too deep, ...); carries its mark and a fix."""

    def __init__(self, problem: str, mark: yaml.Mark, fix: str):
        super().__init__(problem=problem, problem_mark=mark)
        self.mark, self.fix = mark, fix


class _StrictLoader(yaml.SafeLoader):
    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._open_anchors: list[str] = []

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open_anchors:
                raise _Refused(f"alias *{event.anchor} refers to a node that contains it (a structure without end)",
                               event.start_mark, f"remove the alias *{event.anchor} or point it at another node")
            return super().compose_node(parent, index)
        if not self.check_event(MappingStartEvent, SequenceStartEvent):
            return super().compose_node(parent, index)
        event = self.peek_event()
        if self._depth >= MAX_DEPTH:
            raise _Refused(f"nesting deeper than {MAX_DEPTH} levels of mappings and lists", event.start_mark,
                           "flatten the document: a spec nests a few levels, not dozens")
        self._depth += 1
        if event.anchor is not None:
            self._open_anchors.append(event.anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if event.anchor is not None:
                self._open_anchors.pop()


def _construct_map(loader: _StrictLoader, node: yaml.MappingNode) -> Iterator[LineDict]:
    data = LineDict()
    data.line = node.start_mark.line + 1
    data.key_lines = {}
    yield data
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:  # keys written here; keys merged in with `<<` may be overridden
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            kind = "mapping" if isinstance(key, dict) else "list" if isinstance(key, list) else type(key).__name__
            raise _Refused(f"a mapping key must be a plain value, not a {kind}", key_node.start_mark,
                           "write the key as a string") from None
        if key in first_line:
            raise _Refused(f"duplicate key {key!r} (first at line {first_line[key]}): YAML would silently keep "
                           "only the last value", key_node.start_mark, f"keep one {key!r} in this mapping")
        first_line[key] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            data[key] = loader.construct_object(value_node, deep=True)
        except TypeError:  # an unhashable key merged in with `<<`
            raise _Refused("a mapping key must be a plain value", key_node.start_mark,
                           "write the key as a string") from None
        if isinstance(key, str):
            data.key_lines[key] = key_node.start_mark.line + 1


def _construct_seq(loader: _StrictLoader, node: yaml.SequenceNode) -> Iterator[LineList]:
    data = LineList()
    data.line = node.start_mark.line + 1
    yield data
    data.extend(loader.construct_sequence(node, deep=True))


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_StrictLoader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)

_CSafeLoader = getattr(yaml, "CSafeLoader", None)  # None: PyYAML built without libyaml
if _CSafeLoader is not None:
    class _CStrictLoader(_CSafeLoader):  # type: ignore[valid-type, misc]
        """libyaml's parser and composer with the strict loader's constructors."""

    _CStrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
    _CStrictLoader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


class _NotFast(Exception):
    """The C path declines a text; the pure-Python loader reads it (and words any error)."""


def _load_fast(text: str) -> list[Any]:
    """`load_documents` through libyaml; _NotFast (or any YAML error) where the Python loader must decide."""
    if text.startswith("\ufeff") or yaml.reader.Reader.NON_PRINTABLE.search(text):
        raise _NotFast  # libyaml and PyYAML word (and place) these differently
    if _CSafeLoader is None:
        raise _NotFast
    depth = 0
    open_anchors: list[str | None] = []
    for event in yaml.parse(text, Loader=_CSafeLoader):  # events only: the limits hold before composing
        if isinstance(event, (MappingStartEvent, SequenceStartEvent)):
            if depth >= MAX_DEPTH:
                raise _NotFast
            depth += 1
            open_anchors.append(event.anchor)
        elif isinstance(event, (MappingEndEvent, SequenceEndEvent)):
            depth -= 1
            open_anchors.pop()
        elif isinstance(event, AliasEvent) and event.anchor in open_anchors:
            raise _NotFast
    loader = _CStrictLoader(text)
    try:
        docs = []
        while loader.check_data():
            doc = loader.get_data()
            if doc is not None:
                docs.append(doc)
        return docs
    finally:
        loader.dispose()


def decode(data: bytes, file: str = "<input>") -> str:
    """`data` as UTF-8 text; SpecFileError naming the byte offset, line and column of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        bad = data[e.start:e.end].hex(" ")
        raise SpecFileError(
            file, f"not UTF-8: byte(s) {bad} at byte offset {e.start} (line {line}, column {column}) "
                  f"cannot be decoded ({e.reason})", line=line, column=column,
            fix="save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`); spec files must be UTF-8") from None


def load_documents(text: str | bytes, file: str = "<input>") -> list[Any]:
    """Every non-empty document of a (possibly multi-document) YAML text; SpecFileError otherwise."""
    if isinstance(text, bytes):
        text = decode(text, file)
    if _CSafeLoader is not None:
        try:
            return _load_fast(text)
        except Exception:  # noqa: BLE001 - declined or refused: the Python loader below reads it and words the error
            pass
    try:
        return [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except _Refused as e:
        raise SpecFileError(file, str(e.problem), line=e.mark.line + 1, column=e.mark.column + 1, fix=e.fix) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join(x for x in (e.context, e.problem) if x) or str(e)
        raise SpecFileError(file, f"not valid YAML: {problem}", line=(mark.line + 1) if mark else None,
                            column=(mark.column + 1) if mark else None,
                            fix="fix the YAML syntax there (indentation, quotes, colons)") from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (NUL, most control characters)
        line = text.count("\n", 0, max(e.position, 0)) + 1
        char = e.character if isinstance(e.character, int) else ord(e.character)
        raise SpecFileError(file, f"not valid YAML: character #x{char:04x} at line {line} is not allowed "
                                  f"({e.reason})", line=line, fix="remove the control character") from None
    except yaml.YAMLError as e:
        raise SpecFileError(file, f"not valid YAML: {e}", fix="fix the YAML syntax") from None
    except RecursionError:  # aliases nesting nodes into each other past the interpreter's stack
        raise SpecFileError(file, "nesting too deep to read (through aliases)",
                            fix="flatten the document: expand or remove the aliases") from None


def read_documents(path: str | Path) -> list[Any]:
    """The documents of one file. OSError when it cannot be read, SpecFileError when it is not a spec file."""
    p = Path(path)
    return load_documents(p.read_bytes(), str(p))


def discover(path: str | Path) -> list[Path]:
    """A file as given, or every *.yaml / *.yml below a directory, in sorted order.

    Hidden entries below the directory are skipped: a mounted ConfigMap holds each file twice, as
    `name.yaml` and as `..2026_01_01_00_00_00.123/name.yaml` (the `..data` copy Kubernetes swaps
    atomically), and reading both would count every SLO twice."""
    p = Path(path)
    if p.is_dir():
        return sorted(x for x in p.rglob("*") if x.suffix in SUFFIXES and x.is_file()
                      and not any(part.startswith(".") for part in x.relative_to(p).parts))
    return [p]


def discover_all(paths: "list[str | Path] | tuple[str | Path, ...]") -> list[Path]:
    return [f for p in paths for f in discover(p)]


__all__ = ["MAX_DEPTH", "SpecFileError", "LineDict", "LineList", "decode", "load_documents", "read_documents",
           "discover", "discover_all"]
