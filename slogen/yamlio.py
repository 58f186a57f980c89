"""YAML in (with line numbers, for error messages) and YAML out (deterministic, readable).

Reading is `llmslo.specfile`'s, shared with the goodput tap: strict UTF-8, no duplicate keys,
bounded nesting; errors are `SpecFileError`s naming the file, line and fix.

Writing: PyYAML's pure-Python emitter would take most of a build's time (120 MB of YAML for 1,000
SLOs), and libyaml's emitter does not help (its Python callbacks per node remain, and it writes some
texts differently: empty keys, a kept final line break, NEL and the Unicode separators, tabs and
carriage returns), so slogen.yamlfast writes the same bytes as PyYAML directly.
"""

from __future__ import annotations

from typing import Any

import yaml

from llmslo.specfile import LineDict, LineList
from slogen import yamlfast

__all__ = ["ManifestLoader", "dump", "load_manifests"]


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(LineDict, yaml.representer.SafeRepresenter.represent_dict)
_Dumper.add_representer(LineList, yaml.representer.SafeRepresenter.represent_list)

_OPTIONS: dict[str, Any] = dict(sort_keys=False, width=1 << 30, allow_unicode=True, default_flow_style=False)


def _python_dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, **_OPTIONS)


def dump(obj: Any) -> str:
    """Block-style YAML in insertion order, multi-line strings as literal blocks, no line folding.

    slogen.yamlfast writes the plain trees slogen makes (PyYAML's layout; PyYAML itself consulted once
    per unusual string); anything else goes to PyYAML's own emitter. The bytes are PyYAML's either way.
    """
    text = yamlfast.write(obj, _python_dump)
    return text if text is not None else _python_dump(obj)


class ManifestLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading a bare `=` as the string it is to Kubernetes. YAML 1.1 types a plain `=`
    as its `value` tag, which PyYAML cannot construct; the AlertmanagerConfig CRD's matchType enum and
    kustomize's output of an AlertmanagerConfig (`matchType: =`, unquoted) both have one."""


def _bare_value(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


ManifestLoader.add_constructor("tag:yaml.org,2002:value", _bare_value)


def load_manifests(text: str) -> list[Any]:
    """The documents of a rendered manifest stream (kustomize's output), empty ones dropped."""
    return [d for d in yaml.load_all(text, Loader=ManifestLoader) if d is not None]
