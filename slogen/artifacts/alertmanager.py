"""Alertmanager routing for the generated alerts (`alerts/alertmanager.yaml`): one incident, one page.

A pure function of the catalog: the window catalogs its SLOs alert on set the timers, the ticket
tiers name what a page silences, and the health alerts' severities pick their receivers. Why this
shape (docs/slogen.md, "Alertmanager routing"):

* **Pages are grouped per service and cluster**, not per alert. A slowdown burns TTFT, TPOT and
  goodput of one service together, over two page tiers each: six alerts that cross their
  thresholds at different times (goodput's looser objective last, or never). Grouped, they are one
  Alertmanager group, so one notification, whatever order they fire in. Inhibition cannot do this:
  it only silences, and a goodput page that arrives after a TTFT page and silences it would change
  the group's alerts and send a second notification.
* **The page group is re-notified at most every two page-slow short windows** (1h on the 30d
  catalog). Alerts that join an open incident, and tiers that resolve one by one, wait for that
  interval; a page-slow tier keeps firing up to its short window after the burn stops, so an
  incident that stops burning within that window gets its page and then one all-clear.
* **A page silences the service's burn-rate tickets in the same cluster** (inhibition, all the
  service's SLOs: they are the same incident, and the ticket tiers of the SLOs that burn fire as
  fast as the page or faster). Tickets wait one page-quick short window before their first
  notification, so a burn about to page pages first. No-data (and any other non-burn ticket) is
  not silenced: it says the monitoring is blind, another problem.
* **An SLO's page-quick is silenced while its page-slow fires** (same SLO, same cluster): the two
  see the same burn, and page-quick resolves a short window earlier; without it a receiver that
  does not deduplicate (webhook, chat) hears of one incident's end twice, or more when the page
  group's reading falls between the two. Together with the rules holding a short window that sees
  no requests (rules/alerts.py), a low-traffic incident is one page and one all-clear.
* Health alerts (`llmslo-health`) page when critical, else ticket, grouped per alert and cluster.
* **An SLO labelled `team: X` pages and tickets receiver X** once X has a URL (`KubeOptions.receivers`):
  its own page and ticket routes, before the generic ones, with the same grouping and timers; the
  inhibition is the same for every team (it reads severities, services and clusters, not receivers).

Receivers are build settings (`KubeOptions.receivers`: name -> webhook URL). None given, the routing
is the placeholder one (`llmslo-page`, `llmslo-ticket`, no integrations, no team routes): the header
says how to fill them in, the demo puts its webhook URLs there, and the build warns
(`receiver_warnings`). A team gets its own routes only when its receiver has a URL: until then its
alerts go to the generic receivers, never to a receiver that notifies no one. A receiver routed to
without a URL, a team without one, and a URL nothing routes to are warnings, so `--strict` fails the build.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmslo.conventions import LABEL_ALERTNAME, LABEL_CLUSTER
from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration
from slogen.errors import SpecError
from slogen.k8smeta import NO_META, ObjectMeta
from slogen.loaders.windows import BUILTIN
from slogen.model import AlertWindows
from slogen.writers import GENERATED_MARKER, K8S_LABELS
from slogen.yamlio import dump

ALERTMANAGER_FILE = "alerts/alertmanager.yaml"
PAGE_RECEIVER = "llmslo-page"
TICKET_RECEIVER = "llmslo-ticket"
RECEIVERS = (PAGE_RECEIVER, TICKET_RECEIVER)
TEAM_LABEL = "team"  # an SLO's `labels: {team: X}` routes its pages and tickets to receiver X
RECEIVER_FIX = "give it a URL with --receiver NAME=URL or in llmslo.yaml receivers:"
PAGE_GROUP_BY = (C.LABEL_SERVICE, LABEL_CLUSTER)  # one incident: a service in a cluster
TICKET_GROUP_BY = (C.LABEL_SERVICE, C.LABEL_SLO, LABEL_CLUSTER)  # one ticket per SLO and cluster
HEALTH_GROUP_BY = (LABEL_ALERTNAME, LABEL_CLUSTER)
CRITICAL = "critical"  # the health alerts' severity that pages (slogen.rules.health)
DEFAULT_PERIOD = 30 * 24 * 3_600_000  # the catalog that sets the timers when no SLO alerts


@dataclass(frozen=True)
class RouteTimers:
    """Alertmanager's three timers for one route, in milliseconds."""

    group_wait: int
    group_interval: int
    repeat_interval: int

    def fields(self) -> dict[str, str]:
        return {"group_wait": format_prometheus_duration(self.group_wait),
                "group_interval": format_prometheus_duration(self.group_interval),
                "repeat_interval": format_prometheus_duration(self.repeat_interval)}


@dataclass(frozen=True)
class Timers:
    page: RouteTimers  # SLO pages
    ticket: RouteTimers  # SLO tickets, health warnings, anything else (the root route)
    health_page: RouteTimers  # critical health alerts


def _longest(catalogs: Sequence[AlertWindows], pick) -> int:
    return max(pick(w) for w in catalogs)


def timers(catalogs: Sequence[AlertWindows]) -> Timers:
    """The routes' timers from the alert-window catalogs in use (the longest window of each kind):

    | timer | rule | 30d catalog |
    |---|---|---|
    | page group_wait | page-quick short window / 10 | 30s |
    | page group_interval | 2 x page-slow short window | 1h |
    | page repeat_interval | page-slow long window | 6h |
    | ticket group_wait | page-quick short window | 5m |
    | ticket group_interval | ticket-quick short window | 2h |
    | ticket repeat_interval | ticket-quick long window | 1d |
    | health page group_interval | page-quick short window | 5m |

    A compressed catalog (demo/windows.yaml, 30x) compresses them alike, so the demo runs this
    very routing at its own pace.
    """
    cats = list(catalogs) or [BUILTIN[DEFAULT_PERIOD]]
    pq_short = _longest(cats, lambda w: w.page_quick.short_window)
    ps_short = _longest(cats, lambda w: w.page_slow.short_window)
    ps_long = _longest(cats, lambda w: w.page_slow.long_window)
    tq_short = _longest(cats, lambda w: w.ticket_quick.short_window)
    tq_long = _longest(cats, lambda w: w.ticket_quick.long_window)
    page_wait = max(1000, pq_short // 10)
    return Timers(page=RouteTimers(page_wait, 2 * ps_short, ps_long),
                  ticket=RouteTimers(pq_short, tq_short, tq_long),
                  health_page=RouteTimers(page_wait, pq_short, ps_long))


def _alternation(values: Iterable[str]) -> str:
    return "|".join(sorted(set(values)))


def _eq(label: str, value: str) -> str:
    """`label="value"`, the value quoted as Alertmanager's matcher parser reads it."""
    return f"{label}={json.dumps(value, ensure_ascii=False)}"


def routed_teams(teams: Iterable[str], receivers: Mapping[str, str] | None) -> list[str]:
    """The teams with a route of their own: those whose receiver has a URL. A team without one keeps the generic
    receivers (and the build warns): a route to a receiver with no integration would page no one."""
    return sorted(t for t in set(teams) if (receivers or {}).get(t))


def receivers_used(teams: Iterable[str] = (), receivers: Mapping[str, str] | None = None) -> list[str]:
    """The receivers the routing sends to, in its order: the generic two, then one per routed team."""
    return list(dict.fromkeys([*RECEIVERS, *routed_teams(teams, receivers)]))


def _receiver(name: str, receivers: Mapping[str, str]) -> dict:
    url = receivers.get(name)
    return {"name": name, "webhook_configs": [{"url": url}]} if url else {"name": name}


def alertmanager_config(catalogs: Sequence[AlertWindows], ticket_tiers: Sequence[str] = (),
                        health_alerts: Sequence[tuple[str, str]] = (), teams: Sequence[str] = (),
                        receivers: Mapping[str, str] | None = None) -> dict:
    """The configuration as a dict. `ticket_tiers`: the `slo_tier` values of burn-rate tickets (none:
    Sloth-compatible alerts, which have no tier label, so every ticket is a burn-rate ticket);
    `health_alerts`: (alert name, severity) of the health alerts built alongside; `teams`: the SLOs' `team`
    label values; `receivers`: receiver name -> webhook URL. Without receivers: the placeholder routing (no
    team routes, receivers without integrations); with any, each team's pages and tickets go to the receiver
    named after it and each receiver gets its URL (one without stays without integrations)."""
    t = timers(catalogs)
    page = f'{C.LABEL_SEVERITY}="page"'
    ticket = f'{C.LABEL_SEVERITY}="ticket"'
    routes: list[dict] = []
    for team in routed_teams(teams, receivers):  # before the generic routes: the first match wins
        routes += [
            {"receiver": team, "matchers": [_eq(TEAM_LABEL, team), page], "group_by": list(PAGE_GROUP_BY),
             **t.page.fields()},
            {"receiver": team, "matchers": [_eq(TEAM_LABEL, team), ticket], "group_by": list(TICKET_GROUP_BY)},
        ]
    routes += [
        {"receiver": PAGE_RECEIVER, "matchers": [page], "group_by": list(PAGE_GROUP_BY), **t.page.fields()},
        {"receiver": TICKET_RECEIVER, "matchers": [ticket], "group_by": list(TICKET_GROUP_BY)},
    ]
    critical = [name for name, sev in health_alerts if sev == CRITICAL]
    warning = [name for name, sev in health_alerts if sev != CRITICAL]
    if critical:
        routes.append({"receiver": PAGE_RECEIVER, "matchers": [f'{LABEL_ALERTNAME}=~"{_alternation(critical)}"'],
                       "group_by": list(HEALTH_GROUP_BY), **t.health_page.fields()})
    if warning:
        routes.append({"receiver": TICKET_RECEIVER, "matchers": [f'{LABEL_ALERTNAME}=~"{_alternation(warning)}"'],
                       "group_by": list(HEALTH_GROUP_BY)})
    target = [ticket] + ([f'{C.LABEL_TIER}=~"{_alternation(ticket_tiers)}"'] if ticket_tiers else [])
    return {
        "route": {"receiver": TICKET_RECEIVER, "group_by": list(HEALTH_GROUP_BY), **t.ticket.fields(),
                  "routes": routes},
        "inhibit_rules": [
            {"source_matchers": [page], "target_matchers": target, "equal": list(PAGE_GROUP_BY)},
        ] + ([
            # One SLO's page-quick is silenced while its page-slow fires (the same burn, seen over longer
            # windows): page-quick resolves one short window earlier, and a receiver that does not deduplicate
            # would hear of it alone, then of page-slow's end: two all-clears for one incident.
            {"source_matchers": [page, f'{C.LABEL_TIER}="page-slow"'],
             "target_matchers": [page, f'{C.LABEL_TIER}="page-quick"'],
             "equal": [C.LABEL_ID, *PAGE_GROUP_BY[1:]]},
        ] if ticket_tiers else []),
        "receivers": [_receiver(name, receivers or {}) for name in receivers_used(teams, receivers)],
    }


def receiver_warnings(teams: Sequence[str] = (), receivers: Mapping[str, str] | None = None,
                      routed: bool = True) -> list[SpecError]:
    """What the build says about the routing's receivers: each one routed to without a URL (Alertmanager accepts
    it and notifies no one), each team without a URL (its alerts go to the generic receivers meanwhile), and each
    URL given for a receiver nothing routes to. `routed`: whether the build has a routing (it has none without
    alerts: then only URLs given are worth a word)."""
    given = dict(receivers or {})
    used = receivers_used(teams, given) if routed else []
    where = "slogen build"
    routing = "the routing (alerts/alertmanager.yaml, the AlertmanagerConfig)"
    out = [SpecError(where, f"{routing} sends alerts to receiver {name}, which has no URL: Alertmanager notifies no "
                            "one of them", fix=RECEIVER_FIX.replace("NAME", name))
           for name in used if not given.get(name)]
    if routed:
        out += [SpecError(where, f"{routing} sends the pages and tickets of the SLOs labelled {TEAM_LABEL}={team} to "
                                 f"{PAGE_RECEIVER} and {TICKET_RECEIVER}: receiver {team}, which has no URL, would "
                                 "notify no one", fix=RECEIVER_FIX.replace("NAME", team))
                for team in sorted(set(teams) - set(RECEIVERS)) if not given.get(team)]
    out += [SpecError(where, f"receiver {name} has a URL, but {routing} sends nothing to it (its receivers: "
                             f"{', '.join(used) or 'none, the build has no alerts'})",
                      fix=f"label the SLOs whose alerts it should get {TEAM_LABEL}: {name}, or drop its URL")
            for name in given if name not in used]
    return out


_TITLE = f"""# {GENERATED_MARKER} (VERSION): Alertmanager routing and inhibition for the generated alerts.
"""
_PLACEHOLDERS = f"""# DO NOT EDIT: change the SLO specs or the window catalogs and run `slogen build` (docs/slogen.md, "Alertmanager routing").
#
# Receivers are placeholders: give them integrations before use (slogen build --receiver NAME=URL, or
# llmslo.yaml receivers:), or by hand, e.g.
#   - name: {PAGE_RECEIVER}        # pages: whoever is on call for the service
#     pagerduty_configs: [{{routing_key: <secret>}}]
#   - name: {TICKET_RECEIVER}      # tickets: the team's queue or channel, read in working hours
#     webhook_configs: [{{url: https://tickets.example.com/alertmanager}}]
"""
_CONFIGURED = f"""# DO NOT EDIT: change the SLO specs, the window catalogs or the receivers (--receiver NAME=URL, llmslo.yaml
# receivers:) and run `slogen build` (docs/slogen.md, "Alertmanager routing").
#
# Receivers post to the webhook URLs the build was given: {PAGE_RECEIVER} (pages) and {TICKET_RECEIVER} (tickets),
# and one per SLO {TEAM_LABEL} label, which gets that team's pages and tickets. A receiver without
# webhook_configs had no URL (the build warned): Alertmanager notifies no one of what routes to it.
"""
_SHAPE = f"""# Use this file as Alertmanager's configuration (`amtool check-config` accepts it), or merge it into
# yours: copy `route.routes` under a route of your tree that receives these alerts, `inhibit_rules`,
# and the receivers. `python -m demo` fills the receivers with its webhook.
#
# One incident, one page: pages are grouped per {', '.join(PAGE_GROUP_BY)} (TTFT, TPOT, goodput and
# availability pages of a service in a cluster are one notification; alerts joining it wait for
# group_interval); a firing page silences that service's burn-rate tickets in the same cluster;
# tickets are grouped per {', '.join(TICKET_GROUP_BY)}. Timers follow the alert-window catalog.
"""


def _configured(receivers: Sequence[dict]) -> bool:
    """Whether the receivers came from the build's settings (any has a URL) rather than being placeholders."""
    return any("webhook_configs" in r or "webhookConfigs" in r for r in receivers)


def alertmanager_file(config: dict, version: str) -> str:
    head = _TITLE + (_CONFIGURED if _configured(config["receivers"]) else _PLACEHOLDERS) + _SHAPE
    return head.replace("VERSION", version, 1) + "\n" + dump(config)


# --- the same routing as prometheus-operator's AlertmanagerConfig (monitoring.coreos.com/v1alpha1) ----------

ALERTMANAGER_CONFIG_API = "monitoring.coreos.com/v1alpha1"
_MATCHER = re.compile(r'^([a-zA-Z_][a-zA-Z0-9_]*)(=~|!~|!=|=)"((?:[^"\\]|\\.)*)"$')
_TIMERS = {"group_wait": "groupWait", "group_interval": "groupInterval", "repeat_interval": "repeatInterval"}


def crd_matcher(text: str) -> dict:
    """`name="value"` (as `alertmanager_config` writes matchers) as the CRD's {name, value, matchType}."""
    m = _MATCHER.match(text)
    if m is None:  # alertmanager_config writes only this form
        raise ValueError(f"not a matcher of the form name=\"value\": {text!r}")
    return {"name": m.group(1), "value": json.loads(f'"{m.group(3)}"'), "matchType": m.group(2)}


def _crd_route(route: dict) -> dict:
    out: dict = {"receiver": route["receiver"]}
    if "group_by" in route:
        out["groupBy"] = list(route["group_by"])
    out.update({_TIMERS[k]: route[k] for k in _TIMERS if k in route})
    if "matchers" in route:
        out["matchers"] = [crd_matcher(t) for t in route["matchers"]]
    if "routes" in route:
        out["routes"] = [_crd_route(r) for r in route["routes"]]
    return out


def alertmanager_config_object(config: dict, name: str, meta: ObjectMeta = NO_META) -> dict:
    """`config` (what `alertmanager_config` returns) as an AlertmanagerConfig: the same routes, grouping,
    timers, inhibition and receivers, in the CRD's camelCase. prometheus-operator adds a `namespace`
    matcher (the object's namespace) to its top route and inhibit rules unless the Alertmanager's
    alertmanagerConfigMatcherStrategy is None: a build with a namespace gives every alert that label
    (slogen.rules.scope; docs/deploy.md, "4. Routing")."""
    inhibit = [{"sourceMatch": [crd_matcher(t) for t in r["source_matchers"]],
                "targetMatch": [crd_matcher(t) for t in r["target_matchers"]],
                "equal": list(r["equal"])} for r in config["inhibit_rules"]]
    return {"apiVersion": ALERTMANAGER_CONFIG_API, "kind": "AlertmanagerConfig",
            "metadata": meta.metadata(name, managed={**K8S_LABELS, "app.kubernetes.io/component": "alerting"}),
            "spec": {"route": _crd_route(config["route"]), "inhibitRules": inhibit,
                     "receivers": [_crd_receiver(r) for r in config["receivers"]]}}


def _crd_receiver(receiver: dict) -> dict:
    out: dict = {"name": receiver["name"]}
    if "webhook_configs" in receiver:
        out["webhookConfigs"] = [{"url": w["url"]} for w in receiver["webhook_configs"]]
    return out


_CRD_HEAD = f"""# {GENERATED_MARKER} (VERSION): alerts/alertmanager.yaml as prometheus-operator's AlertmanagerConfig.
# DO NOT EDIT: change the SLO specs or the window catalogs and run `slogen build`.
#
# The same routes, grouping, timers, inhibition and receivers as alerts/alertmanager.yaml.
"""
_CRD_NAMESPACE = """# prometheus-operator adds a matcher namespace="<this object's namespace>" to the top route and to every
# inhibit rule (alertmanagerConfigMatcherStrategy OnNamespace, its default): every generated alert carries
# namespace="NAMESPACE" (an alert's own namespace, where its series had one, is exported_namespace), so apply
# this object in namespace NAMESPACE (docs/deploy.md, "Alertmanager routing").
"""
_CRD_NO_NAMESPACE = """# prometheus-operator adds a matcher namespace="<this object's namespace>" to the top route and to every
# inhibit rule, unless the Alertmanager sets alertmanagerConfigMatcherStrategy: {type: None}; the alerts carry
# no such label unless built with a namespace: read docs/deploy.md, "Alertmanager routing", before applying it.
"""
_CRD_RECEIVERS = """# Receivers post to the URLs the build was given (webhookConfigs; the operator names them
# <namespace>/<this object's name>/<receiver>). A receiver without webhookConfigs had no URL (the build warned).
# For a URL that is a secret, patch it into a urlSecret (a Secret reference) in your overlay.
"""
_CRD_PLACEHOLDERS = """# Give the receivers integrations (a patch in your overlay, e.g. pagerdutyConfigs with a Secret reference,
# or build with --receiver NAME=URL) before use.
"""


def alertmanager_config_file(obj: dict, version: str, namespace: str = "") -> str:
    """The object's file: its header says what the operator adds and what the receivers are. `namespace`: the
    build's (`KubeOptions.namespace`), which every alert carries."""
    head = (_CRD_HEAD + (_CRD_NAMESPACE.replace("NAMESPACE", namespace) if namespace else _CRD_NO_NAMESPACE)
            + (_CRD_RECEIVERS if _configured(obj["spec"]["receivers"]) else _CRD_PLACEHOLDERS))
    return head.replace("VERSION", version, 1) + "\n" + dump(obj)


__all__ = ["ALERTMANAGER_FILE", "PAGE_RECEIVER", "TEAM_LABEL", "TICKET_RECEIVER", "alertmanager_config",
           "alertmanager_config_file", "alertmanager_config_object", "alertmanager_file", "receiver_warnings",
           "receivers_used", "routed_teams", "timers"]
