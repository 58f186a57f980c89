"""The overlays carry the label kube-prometheus-stack selects by, where it selects, and put the routing and the
dashboards where Alertmanager and Grafana's sidecar look (#28)."""

from __future__ import annotations

import yaml

from .conftest import DEPLOY

COMPONENT = DEPLOY / "components" / "monitoring-labels" / "kustomization.yaml"
SELECTED_KINDS = {"PrometheusRule", "PodMonitor", "ServiceMonitor", "AlertmanagerConfig"}


def _pairs() -> dict[str, str]:
    doc = yaml.safe_load(COMPONENT.read_text())
    assert doc["kind"] == "Component"
    (entry,) = doc["labels"]
    assert {f["kind"] for f in entry["fields"]} == SELECTED_KINDS
    return entry["pairs"]


def _monitoring_namespace(overlay: str) -> str:
    """The overlay's parameter (a local-config object: kustomize reads it and leaves it out of the output)."""
    params = yaml.safe_load((DEPLOY / "overlays" / overlay / "deploy-parameters.yaml").read_text())
    return params["data"]["monitoringNamespace"]


def test_every_selected_kind_carries_the_components_labels_and_nothing_else_does(built):
    pairs = _pairs()
    assert pairs == {"release": "kube-prometheus-stack"}
    for overlay, objects in built.items():
        selected = [o for o in objects if o["kind"] in SELECTED_KINDS]
        assert {o["kind"] for o in selected} >= {"PrometheusRule", "PodMonitor", "AlertmanagerConfig"}, overlay
        for obj in selected:
            labels = obj["metadata"].get("labels", {})
            assert {k: labels.get(k) for k in pairs} == pairs, (overlay, obj["kind"], obj["metadata"]["name"])
        others = [o for o in objects if o["kind"] not in SELECTED_KINDS]
        assert all("release" not in o["metadata"].get("labels", {}) for o in others), overlay


def test_routing_and_dashboards_go_to_the_monitoring_namespace(built):
    for overlay, objects in built.items():
        ns = _monitoring_namespace(overlay)
        routing = [o for o in objects if o["kind"] == "AlertmanagerConfig"]
        dashboards = [o for o in objects if o["kind"] == "ConfigMap"
                      and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "dashboard"]
        assert len(routing) == 1 and len(dashboards) >= 2, overlay
        assert {o["metadata"].get("namespace") for o in routing + dashboards} == {ns}, overlay
        assert all(o["metadata"]["labels"]["grafana_dashboard"] == "1" for o in dashboards)
