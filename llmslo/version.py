"""The one version of llmslo, as the installed distribution's metadata has it.

pyproject.toml's `version` is written in one place; `pip install` (editable or not) copies it into the
distribution's metadata, and everything that names a version reads it from there through `version()`:
`llmslo.__version__`, the exporter's `--version` and `llmslo_build_info`, `slogen --version` and the
`sloth_version` label of generated rules, and `scripts/release.sh`. The fallback is for a source tree run
without an install: the version in the pyproject.toml beside the package, else `0+unknown`.
"""

from __future__ import annotations

import functools
from pathlib import Path

DISTRIBUTION = "llmslo"
UNKNOWN = "0+unknown"


@functools.cache
def version() -> str:
    """llmslo's version: the installed distribution's, else the source tree's pyproject.toml's."""
    from importlib import metadata  # not at import time: `import llmslo` stays cheap for the exporter

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return _source_tree_version()


def _source_tree_version() -> str:
    import tomllib

    try:
        project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return UNKNOWN
    return str(project["version"]) if project.get("name") == DISTRIBUTION and project.get("version") else UNKNOWN
