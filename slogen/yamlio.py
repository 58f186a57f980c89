"""YAML in (with line numbers, for error messages) and YAML out (deterministic, readable).

Reading is `llmslo.specfile`'s, shared with the goodput tap: strict UTF-8, no duplicate keys,
bounded nesting; errors are `SpecFileError`s naming the file, line and fix.

Writing goes through libyaml's emitter where PyYAML has it: PyYAML's pure-Python emitter was 83% of
a rules-only build. Both emit the same bytes for the texts slogen writes (checked on every generated
file, and on 150,000 random strings over YAML's special characters), but not for a few characters
that libyaml escapes or breaks differently: carriage returns and tabs, NEL and the Unicode line
separators, characters beyond the BMP, a BOM, other control characters, and a string that is or ends
in two line breaks (libyaml adds a `...` document end after a "keep" literal block, `|+`). A document
holding any of these is written by the Python emitter, so the output is byte-identical either way.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from llmslo.specfile import LineDict, LineList, SpecFileError, load_documents, read_documents

__all__ = ["LineDict", "LineList", "SpecFileError", "load_documents", "read_documents", "dump"]


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(LineDict, yaml.representer.SafeRepresenter.represent_dict)
_Dumper.add_representer(LineList, yaml.representer.SafeRepresenter.represent_list)


_CDumper = getattr(yaml, "CSafeDumper", None)  # None: PyYAML built without libyaml
_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
_RESOLVED: dict[tuple[str, tuple[bool, bool]], str] = {}  # a scalar's implicit tag: the same few values recur
if _CDumper is not None:
    class _FastDumper(_CDumper):  # type: ignore[valid-type, misc]
        """libyaml's emitter; strings, mappings and lists turned into nodes here, as the representers
        registered below would (PyYAML's generic dispatch was most of what remained), the rest by PyYAML."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

        def represent_data(self, data: Any) -> yaml.Node:
            kind = type(data)
            if kind is str:
                return yaml.ScalarNode(_STR, data, style="|" if "\n" in data else None)
            if kind is dict or kind is LineDict:
                return yaml.MappingNode(_MAP, [(self.represent_data(k), self.represent_data(v)) for k, v in data.items()],
                                        flow_style=self.default_flow_style)
            if kind is list or kind is LineList:
                return yaml.SequenceNode(_SEQ, [self.represent_data(x) for x in data], flow_style=self.default_flow_style)
            return super().represent_data(data)

        def resolve(self, kind: type, value: Any, implicit: Any) -> str:
            if kind is not yaml.ScalarNode:
                return super().resolve(kind, value, implicit)
            key = (value, implicit)
            tag = _RESOLVED.get(key)
            if tag is None:
                tag = super().resolve(kind, value, implicit)
                if len(_RESOLVED) < 65536:
                    _RESOLVED[key] = tag
            return tag

    _FastDumper.add_representer(str, _represent_str)
    _FastDumper.add_representer(LineDict, yaml.representer.SafeRepresenter.represent_dict)
    _FastDumper.add_representer(LineList, yaml.representer.SafeRepresenter.represent_list)

# What libyaml may write unlike PyYAML, as json.dumps (ensure_ascii=False) spells it: \r, \t, other C0
# controls (\u00XX), a string that is or ends in two line breaks (YAML's "keep" literal, `|+`), DEL and C1
# controls (NEL among them), line and paragraph separators, surrogates, a BOM, non-characters, characters
# beyond the BMP.
_NOT_FOR_LIBYAML = re.compile(r'\\[rtbf]|\\u00|\\n\\n"|"\\n"|[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff\U00010000-\U0010ffff]')
_OPTIONS = dict(sort_keys=False, width=1 << 30, allow_unicode=True, default_flow_style=False)


_NOT_FOR_LIBYAML_ASCII = ("\\r", "\\t", "\\b", "\\f", "\\u00", '\\n\\n"', '"\\n"', "\x7f")  # the same, in ASCII text


def _libyaml_writes_it_alike(obj: Any) -> bool:
    try:
        text = json.dumps(obj, ensure_ascii=False)  # C speed; every string of `obj` as JSON escapes it
    except (TypeError, ValueError):  # a value JSON cannot hold (a tuple key, a custom type): no opinion
        return False
    if text.isascii():  # the usual case: substring scans are many times faster than the regex
        return not any(bad in text for bad in _NOT_FOR_LIBYAML_ASCII)
    return _NOT_FOR_LIBYAML.search(text) is None


def dump(obj: Any) -> str:
    """Block-style YAML in insertion order, multi-line strings as literal blocks, no line folding."""
    if _CDumper is not None and _libyaml_writes_it_alike(obj):
        return yaml.dump(obj, Dumper=_FastDumper, **_OPTIONS)
    return yaml.dump(obj, Dumper=_Dumper, **_OPTIONS)
