"""slogen: SLO specs in, Prometheus rules, alerts, dashboards, KEDA objects and runbooks out."""

from __future__ import annotations

from llmslo.version import version as _version

# llmslo's version, from the installed distribution's metadata (llmslo/version.py).
__version__ = _version()

# The `sloth_version` label value on generated rules (Sloth writes its own version there).
VERSION_LABEL = f"slogen-{__version__}"
