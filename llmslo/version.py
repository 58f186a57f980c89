"""The one version of llmslo, as the installed distribution's metadata has it.

pyproject.toml's `version` is written in one place; `pip install` (editable or not) copies it into the
distribution's metadata, and everything that names a version reads it from there through `version()`:
`llmslo.__version__`, the exporter's `--version` and `llmslo_build_info`, `slogen --version` and the
`sloth_version` label of generated rules, and `scripts/release.sh`. The fallback is for a source tree run
without an install: the version in the pyproject.toml beside the package, else `0+unknown`.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path

DISTRIBUTION = "llmslo"
UNKNOWN = "0+unknown"


@functools.cache
def version() -> str:
    """llmslo's version: the installed distribution's, else the source tree's pyproject.toml's."""
    found = _dist_info_version()
    if found is not None:
        return found
    from importlib import metadata  # eggs, zips and other finders: the full reader, about 15 ms to import

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return _source_tree_version()


def _dist_info_version() -> str | None:
    """The `Version:` of the first `llmslo-*.dist-info/METADATA` on sys.path, the one importlib.metadata would
    read, without importing it (it loads email, zipfile and csv: a third of `llmslo-exporter --once`'s imports)."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            # `{name}-{version}.dist-info`, the name normalized (PEP 503) and the version without a dash
            dist, _, _ = name.removesuffix(".dist-info").rpartition("-")
            if name.endswith(".dist-info") and re.sub(r"[-_.]+", "_", dist).lower() == DISTRIBUTION:
                return _metadata_version(os.path.join(entry or ".", name, "METADATA"))
    return None


def _metadata_version(path: str) -> str | None:
    """The `Version` header of a core-metadata file (headers end at the first blank line)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                if key.strip().lower() == "version":
                    return value.strip()
    except OSError:
        pass
    return None


def _source_tree_version() -> str:
    import tomllib

    try:
        project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return UNKNOWN
    return str(project["version"]) if project.get("name") == DISTRIBUTION and project.get("version") else UNKNOWN
