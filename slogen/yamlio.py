"""YAML in (with line numbers, for error messages) and YAML out (deterministic, readable).

Reading is `llmslo.specfile`'s, shared with the goodput tap: strict UTF-8, no duplicate keys,
bounded nesting; errors are `SpecFileError`s naming the file, line and fix.
"""

from __future__ import annotations

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


def dump(obj: Any) -> str:
    """Block-style YAML in insertion order, multi-line strings as literal blocks, no line folding."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=1 << 30, allow_unicode=True, default_flow_style=False)
