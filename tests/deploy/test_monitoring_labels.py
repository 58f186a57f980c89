"""The overlays carry the labels kube-prometheus-stack selects by on every object, from one place (llmslo.yaml),
and put the routing and the dashboards where Alertmanager and Grafana's sidecar look (#28, #33)."""

from __future__ import annotations

from slogen import settings

from .conftest import ROOT

SETTINGS = settings.load(ROOT / "llmslo.yaml")


def test_every_object_carries_the_settings_labels(built):
    assert SETTINGS.object_labels == {"release": "kube-prometheus-stack"}
    for overlay, objects in built.items():
        install = [o for o in objects if o["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") != "llmslo-example"]
        assert {o["kind"] for o in install} >= {"PrometheusRule", "PodMonitor", "AlertmanagerConfig", "DaemonSet"}
        for obj in install:
            labels = obj["metadata"].get("labels", {})
            assert SETTINGS.object_labels.items() <= labels.items(), (overlay, obj["kind"], obj["metadata"]["name"])


def test_routing_and_dashboards_go_to_the_monitoring_namespace(built):
    for overlay, objects in built.items():
        routing = [o for o in objects if o["kind"] == "AlertmanagerConfig"]
        dashboards = [o for o in objects if o["kind"] == "ConfigMap"
                      and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "dashboard"]
        assert len(routing) == 1 and len(dashboards) >= 2, overlay
        assert {o["metadata"].get("namespace") for o in routing + dashboards} == {SETTINGS.namespace}, overlay
        assert all(o["metadata"]["labels"]["grafana_dashboard"] == "1" for o in dashboards)
