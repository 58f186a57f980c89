"""YAML in (with line numbers, for error messages) and YAML out (deterministic, readable)."""

from __future__ import annotations

from typing import Any, Iterator

import yaml


class LineDict(dict):
    """A mapping that remembers the line it starts on and the line of each key."""

    line: int | None = None
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int | None:
        return getattr(self, "key_lines", {}).get(key, self.line)


class LineList(list):
    line: int | None = None


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> Iterator[LineDict]:
    data = LineDict()
    data.line = node.start_mark.line + 1
    data.key_lines = {}
    yield data
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        data[key] = loader.construct_object(value_node, deep=True)
        if isinstance(key, str):
            data.key_lines[key] = key_node.start_mark.line + 1


def _construct_seq(loader: _LineLoader, node: yaml.SequenceNode) -> Iterator[LineList]:
    data = LineList()
    data.line = node.start_mark.line + 1
    yield data
    data.extend(loader.construct_sequence(node, deep=True))


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


def load_documents(text: str) -> list[Any]:
    """Every non-empty document of a (possibly multi-document) YAML text."""
    return [d for d in yaml.load_all(text, Loader=_LineLoader) if d is not None]


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(LineDict, yaml.representer.SafeRepresenter.represent_dict)
_Dumper.add_representer(LineList, yaml.representer.SafeRepresenter.represent_list)


def dump(obj: Any) -> str:
    """Block-style YAML in insertion order, multi-line strings as literal blocks, no line folding."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=1 << 30, allow_unicode=True, default_flow_style=False)
