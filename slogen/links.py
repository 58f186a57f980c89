"""Where an alert leads: the generated dashboards' stable UIDs and their Grafana URLs.

One place for the UID scheme, so the dashboards generator (which sets each dashboard's `uid`) and
the alerts (whose `dashboard` annotation opens it, `slogen build --grafana-url`) always agree.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import urlsplit

DEFAULT_GRAFANA_URL = "https://grafana.example.com"  # a placeholder, as the default runbook base URL is
GRAFANA_URL_ENV = "SLOGEN_GRAFANA_URL"


def dashboard_uid(prefix: str, key: str) -> str:
    """A stable dashboard uid (8-40 characters), readable where the key is short."""
    slug = re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{prefix}-{slug}"[:31].rstrip("-") + "-" + digest


def slo_dashboard_uid(slo_id: str) -> str:
    """The uid of the per-SLO dashboard of `slo_id` (the `sloth_id` label value)."""
    return dashboard_uid("slo", slo_id)


FLEET_DASHBOARD_UID = dashboard_uid("llmslo", "fleet")  # the fleet serving dashboard
OVERVIEW_DASHBOARD_UID = dashboard_uid("llmslo", "slo-overview")  # every SLO of the build, one row each


def dashboard_url(grafana_url: str, uid: str) -> str:
    """Grafana's short link to a dashboard by uid: <grafana>/d/<uid> (Grafana adds the slug itself)."""
    return f"{grafana_url.rstrip('/')}/d/{uid}"


# Names reserved for examples (RFC 2606, RFC 6761): a link there reaches no one's runbook or Grafana.
_PLACEHOLDER_DOMAINS = ("example.com", "example.net", "example.org")
_PLACEHOLDER_TLDS = (".example", ".invalid", ".test")


def placeholder_host(url: str) -> str | None:
    """The host of `url` when it is a reserved example name (the defaults are: runbooks.example.com,
    grafana.example.com), else None."""
    host = (urlsplit(url.replace("{{", "").replace("}}", "")).hostname or "").lower().rstrip(".")
    if host in _PLACEHOLDER_DOMAINS or host.endswith(tuple("." + d for d in _PLACEHOLDER_DOMAINS)):
        return host
    return host if host.endswith(_PLACEHOLDER_TLDS) else None
