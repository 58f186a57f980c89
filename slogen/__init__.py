"""slogen: SLO specs in, Prometheus rules, alerts, dashboards, KEDA objects and runbooks out."""

from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("llmslo")
except _metadata.PackageNotFoundError:  # running from a source tree without an install
    __version__ = "dev"

# The `sloth_version` label value on generated rules (Sloth writes its own version there).
VERSION_LABEL = f"slogen-{__version__}"
