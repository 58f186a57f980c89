"""The dashboards' ConfigMaps are made by kustomize from the JSON files (`dashboards/kustomization.yaml`), not
committed beside them: `kubectl kustomize` renders the objects the committed ConfigMap files held (same names,
namespace, labels, annotations, data keys, and the JSON byte for byte), and the overlays still deploy them."""

from __future__ import annotations

from pathlib import Path

import yaml

from slogen.artifacts.grafana_provisioning import dashboard_configmap, dashboard_configmaps
from slogen.cli import main
from slogen.k8smeta import KubeOptions, ObjectMeta

from .conftest import DEPLOY, ROOT, kustomize

# What deploy/generated/grafana/llmslo-dashboard-llm-serving-fleet.yaml held (this repository's settings) when
# the ConfigMaps were committed files: the rendered object must keep every field but the data's text.
COMMITTED_FLEET_METADATA = {
    "name": "llmslo-dashboard-llm-serving-fleet",
    "namespace": "monitoring",
    "labels": {"app.kubernetes.io/component": "dashboard", "app.kubernetes.io/managed-by": "slogen",
               "app.kubernetes.io/part-of": "llmslo", "grafana_dashboard": "1", "release": "kube-prometheus-stack"},
    "annotations": {"grafana_folder": "LLM SLOs"},
}


def _by_name(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}


def test_the_repository_dashboards_render_as_the_committed_configmaps_did(kubectl, tmp_path):
    """The repository's build (its llmslo.yaml: namespace, object labels) into a scratch tree; kustomize's
    objects are exactly those the build used to write as files, one per dashboard."""
    assert main(["build", str(ROOT / "slos"), "--out", str(tmp_path), "--settings", str(ROOT / "llmslo.yaml"),
                 "--no-promtool-check"]) == 0
    dashboards = {f"dashboards/{p.name}": p.read_text() for p in (tmp_path / "dashboards").glob("*.json")}
    made = _by_name(kustomize(kubectl, tmp_path / "dashboards"))
    assert len(made) == len(dashboards) >= 3  # the fleet, the overview and one per SLO
    fleet = made["llmslo-dashboard-llm-serving-fleet"]
    assert fleet["metadata"] == COMMITTED_FLEET_METADATA
    assert fleet["data"] == {"llm-serving-fleet.json": dashboards["dashboards/llm-serving-fleet.json"]}
    settings = yaml.safe_load((ROOT / "llmslo.yaml").read_text())
    opts = KubeOptions(namespace=settings["namespace"], meta=ObjectMeta(labels=settings.get("objectLabels", {})))
    expected = {o["metadata"]["name"]: o for o in (dashboard_configmap(p, t, opts) for p, t in dashboards.items())}
    assert made == expected


def test_settings_reach_the_rendered_objects_and_a_long_name_keeps_its_key(kubectl, tmp_path):
    """Other labels, annotations, folder and no namespace; a 255-byte file name whose key is cut to 253 bytes
    (`key=file` in the generator)."""
    opts = KubeOptions(dashboard_labels={"grafana_dashboard": "llm", "team": "sre"},
                       folder_annotation="k8s-sidecar-target-directory", folder="/tmp/dashboards/LLM",
                       meta=ObjectMeta(labels={"release": "kps"}, annotations={"example.com/owner": "sre"}))
    stem = "slo-" + "s" * 233 + "-availability"
    dashboards = {"dashboards/llm-serving-fleet.json": '{"title": "fleet"}\n',
                  f"dashboards/{stem}.json": '{"title": "long \\u00e9"}\n'}
    for rel, text in {**dashboards, **dashboard_configmaps(dashboards, opts, "v")}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    made = _by_name(kustomize(kubectl, tmp_path / "dashboards"))
    expected = {o["metadata"]["name"]: o for o in (dashboard_configmap(p, t, opts) for p, t in dashboards.items())}
    assert made == expected
    long_key = next(iter(expected[next(n for n in expected if "sss" in n)]["data"]))
    assert len(long_key) == 253 and long_key != f"{stem}.json" and "namespace" not in made[next(iter(made))]["metadata"]


def test_the_overlays_deploy_one_configmap_per_committed_dashboard(built):
    """deploy/generated includes dashboards/ (its kustomization): every overlay carries each dashboard once, and
    no ConfigMap copy of a dashboard is committed any more."""
    dashboards = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert not list((DEPLOY / "generated").rglob("llmslo-dashboard-*.yaml"))
    for name, objects in built.items():
        maps = [o for o in objects if o["kind"] == "ConfigMap"
                and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "dashboard"]
        assert {k: v for o in maps for k, v in o["data"].items()} == dashboards, name
        assert len(maps) == len(dashboards), name


def test_the_dashboards_kustomization_lies_beside_the_files_it_reads():
    """kustomize's load restrictor: a generator reads files under its kustomization's folder only."""
    doc = yaml.safe_load((ROOT / "dashboards" / "kustomization.yaml").read_text())
    files = [f.split("=")[-1] for g in doc["configMapGenerator"] for f in g["files"]]
    assert files and all("/" not in f and (ROOT / "dashboards" / f).is_file() for f in files)
    assert Path(ROOT / "dashboards" / "kustomization.yaml").parent == ROOT / "dashboards"
