"""`slogen init DIR`: the user's own repository for their SLOs and the install, from the installed package.

What it writes is a starting point the user owns and edits (the specs, the thresholds, the pools, the
kustomization they add patches to), plus the settings every derived file comes from (`llmslo.yaml`).
Everything derived (rules, dashboards, runbooks, deploy/generated, deploy/install with a copy of the shipped
kustomize bases) is `slogen build`'s, so an upgrade of the package is `pip install -U` and `slogen build`.
"""

from __future__ import annotations

from dataclasses import dataclass

from slogen import settings as st

SETTINGS = st.DEFAULT_NAME
KUSTOMIZATION = "deploy/kustomization.yaml"
SCHEMA_URL = "https://raw.githubusercontent.com/llmslo/llmslo/main/schemas/slogen.schema.json"  # the JSON Schema


@dataclass(frozen=True)
class Scaffold:
    """What `slogen init` asks: the settings, and the service the example SLOs are written for."""

    settings: st.InstallSettings
    service: str = "chat"
    team: str = ""


def _slos(sc: Scaffold) -> str:
    team = f"\nlabels:\n  team: {sc.team}   # routes this service's pages and tickets to the receiver {sc.team}" \
        if sc.team else "\n# labels: {team: <name>}   # routes its pages and tickets to a receiver of that name"
    name = sc.service.capitalize()
    return f"""\
# yaml-language-server: $schema={SCHEMA_URL}
# The SLOs of one service, in Sloth's prometheus/v1 format with llmslo's LLM SLI plugins (docs/slogen.md).
# The goodput tap measures each request as its client sees it; slo_class ties a request to its objectives
# (the tap reads these very files from the ConfigMap `slogen build` writes into each inference namespace).
version: "prometheus/v1"
service: "{sc.service}"{team}
slos:
  # Failed requests (engine errors, broken streams): 99.9% over 30 days.
  - name: "availability"
    objective: 99.9
    description: "Requests complete without an upstream error or a broken stream."
    sli:
      plugin:
        id: "llmslo/availability"
        options: {{source: "tap", slo_class: "interactive"}}
    alerting:
      name: {name}AvailabilityBudgetBurn

  # Time to first token within 500 ms for 99% of requests (a bucket edge the tap adds for it).
  - name: "ttft"
    objective: 99
    description: "Requests get their first token within 500 ms."
    sli:
      plugin:
        id: "llmslo/latency"
        options: {{metric: "ttft", threshold: "0.5", source: "tap", slo_class: "interactive"}}
    alerting:
      name: {name}TTFTBudgetBurn

  # Time per output token within 50 ms (20 tokens/s) for 99% of requests.
  - name: "tpot"
    objective: 99
    description: "Requests stream at 50 ms per output token or faster."
    sli:
      plugin:
        id: "llmslo/latency"
        options: {{metric: "tpot", threshold: "0.05", source: "tap", slo_class: "interactive"}}
    alerting:
      name: {name}TPOTBudgetBurn

  # Goodput: requests within BOTH objectives above, the headline number.
  - name: "goodput"
    objective: 95
    description: "Requests meet both the TTFT (500 ms) and TPOT (50 ms) objectives."
    sli:
      plugin:
        id: "llmslo/goodput"
        options: {{slo_class: "interactive", ttft: "0.5", tpot: "0.05", models: "*"}}
    alerting:
      name: {name}GoodputBudgetBurn
"""


def _pools(sc: Scaffold) -> str:
    ns = sc.settings.inference_namespaces[0]
    return f"""\
# Autoscaling of the inference pools (docs/autoscaling.md): `slogen build` makes a KEDA ScaledObject (and the
# HPA v2 alternative) per pool. Name your engine's Deployment; the namespace must be one of llmslo.yaml's
# inferenceNamespaces.
version: "llmslo/autoscaling/v1"
pools:
  - name: {sc.service}-pool
    namespace: {ns}
    target: {{kind: Deployment, name: {sc.service}-engine}}
    replicas: {{min: 1, max: 8}}
    prometheus: http://prometheus-operated.{sc.settings.namespace}.svc:9090
    match: {{namespace: {ns}}}
    triggers:
      queue_depth: {{per_replica: 4}}
      kv_cache_utilization: {{per_replica: 0.85}}
      ttft_burn_rate: {{slo: {sc.service}/ttft, above: 2, window: 5m}}
"""


def _thresholds() -> str:
    """The health and capacity thresholds at their built-in defaults, each with what it sets (one text with the
    repository's thresholds.yaml, but for where the JSON Schema is)."""
    from slogen import thresholds

    return thresholds.render(SCHEMA_URL)


def _kustomization() -> str:
    return """\
# The observability install: deploy/install is written by `slogen build` from llmslo.yaml (the exporter, the
# rules, dashboards and routing in your namespaces, with your labels, over a copy of the package's bases).
# Add your own patches here; `kubectl kustomize deploy` renders it, `kubectl apply -k deploy` applies it.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - install
"""


CI = """\
# CI: the generated files are current and every warning is an error (copy into your CI of choice).
name: slo-check
on: [push, pull_request]
jobs:
  slogen:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with: {python-version: "3.11"}
      - run: sudo apt-get install -y prometheus   # promtool: slogen checks the rules with it
      - run: pip install llmslo                   # the version you pinned
      - run: slogen build --check --strict
      - run: for f in alerts/*.test.yaml; do promtool test rules "$f"; done
      # every pod the install makes, against its namespace's Pod Security levels, as the API server will check it
      - run: kubectl kustomize deploy | slogen pod-security -
"""


def files(sc: Scaffold) -> dict[str, str]:
    """Relative path -> text of everything `slogen init` writes."""
    return {SETTINGS: st.render(sc.settings), f"slos/{sc.service}.yaml": _slos(sc), "thresholds.yaml": _thresholds(),
            "autoscaling/pools.yaml": _pools(sc), KUSTOMIZATION: _kustomization(),
            ".github/workflows/slo-check.yaml": CI}
