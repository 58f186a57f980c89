"""What Grafana loads the generated dashboards from: ConfigMaps for the sidecar kube-prometheus-stack runs,
and a file-provisioning provider for a Grafana without it.

Why: the dashboards are JSON files; a Grafana in a cluster never reads a repository. The chart's sidecar
watches ConfigMaps carrying its label (`grafana_dashboard: "1"` by default) and files each under the folder
its annotation names; a Grafana without the sidecar reads dashboards from a directory a provider names.
The repository holds each dashboard once, as its JSON file: the ConfigMaps are made from those files by
kustomize (`dashboards/kustomization.yaml`, a `configMapGenerator` per dashboard, which
`deploy/generated/kustomization.yaml` includes), so both paths load the same bytes. A ConfigMap file per
dashboard held every dashboard twice (a 1,000-SLO build: 40 MB more) and cost a second serialization.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from pathlib import PurePosixPath

from slogen.errors import SpecError, SpecErrors
from slogen.k8smeta import MAX_CONFIGMAP_BYTES, MAX_SUBDOMAIN, KubeOptions, configmap_key_problem, subdomain_problem
from slogen.paths import DASHBOARD_DIR, DASHBOARD_KUSTOMIZATION, GRAFANA_PROVIDER_FILE
from slogen.writers import GENERATED_MARKER, K8S_LABELS
from slogen.yamlio import dump

CONFIGMAP_PREFIX = "llmslo-dashboard-"
COMPONENT = "dashboard"  # app.kubernetes.io/component of the ConfigMaps (the overlays select them by it)
PROVIDER_NAME = "llmslo"
HEADER = (f"# {GENERATED_MARKER} ({{version}}): {{what}}.\n"
          "# DO NOT EDIT: change slos/ or the build options (docs/deploy.md, \"Grafana\") and run `slogen build`.\n")


def _fit(text: str, limit: int) -> str:
    """`text` cut to `limit` characters with a hash of the whole kept at the end, when it is longer (an SLO id
    may make a file name of 255 bytes; an object name and a ConfigMap key take 253)."""
    if len(text) <= limit:
        return text
    return text[:limit - 9].rstrip("-.") + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]


def configmap_name(dashboard_path: str) -> str:
    return _fit(CONFIGMAP_PREFIX + PurePosixPath(dashboard_path).stem, MAX_SUBDOMAIN)


def configmap_key(dashboard_path: str) -> str:
    """The dashboard's file name (the sidecar writes the value to a file of this name)."""
    return _fit(PurePosixPath(dashboard_path).stem, MAX_SUBDOMAIN - len(".json")) + ".json"


def _metadata(path: str, opts: KubeOptions) -> dict:
    """The dashboard's ConfigMap's metadata: its name, the namespace, the sidecar's label and folder annotation."""
    managed = {**K8S_LABELS, "app.kubernetes.io/component": COMPONENT}
    return opts.meta.metadata(configmap_name(path), opts.namespace, labels=opts.dashboard_labels, managed=managed,
                              annotations={opts.folder_annotation: opts.folder})


def _check(path: str, size: int) -> None:
    """SpecErrors when the API server would refuse the dashboard's ConfigMap: over the 1 MiB a ConfigMap holds
    (or, defensively, a name or key it refuses)."""
    name, key = configmap_name(path), configmap_key(path)
    problems = []
    if why := subdomain_problem(name):
        problems.append(SpecError(path, f"its ConfigMap name {name!r} {why}", fix="give the SLO a shorter id"))
    if why := configmap_key_problem(key):
        problems.append(SpecError(path, f"its ConfigMap key {key!r} {why}", fix="give the SLO a shorter id"))
    if size > MAX_CONFIGMAP_BYTES:
        problems.append(SpecError(path, f"the dashboard is {size} bytes, more than the {MAX_CONFIGMAP_BYTES} a "
                                        "ConfigMap holds, so the sidecar cannot load it",
                                  fix="split the SLO's service into smaller services, or provision this dashboard "
                                      f"from files ({GRAFANA_PROVIDER_FILE})"))
    if problems:
        raise SpecErrors(problems)


def dashboard_configmap(path: str, text: str, opts: KubeOptions) -> dict:
    """The ConfigMap kustomize makes of one dashboard (key: its file name, value: its JSON as written)."""
    _check(path, len(text.encode()))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(path, opts), "data": {configmap_key(path): text}}


def dashboard_configmaps(dashboards: Mapping[str, str], opts: KubeOptions, version: str) -> dict[str, str]:
    """The kustomization making the sidecar's ConfigMaps from the dashboards (path -> JSON text)."""
    made = DashboardConfigMaps(opts, version)
    for p in sorted(dashboards):
        made.add(p, dashboards[p])
    return made.files()


class DashboardConfigMaps:
    """The same, one dashboard at a time as the build renders them: `add` checks that its ConfigMap fits and
    keeps its generator entry (a line or four: a build holds these, never the dashboards' text), `files` gives
    dashboards/kustomization.yaml."""

    def __init__(self, opts: KubeOptions, version: str) -> None:
        self.opts, self.version = opts, version
        self.generators: list[dict] = []
        self.options: dict = {"disableNameSuffixHash": True}  # the sidecar and the links know the name as is

    def add(self, path: str, text: str) -> None:
        _check(path, len(text.encode()))
        meta = _metadata(path, self.opts)
        for shared in ("labels", "annotations"):  # the same for every dashboard: said once, for all
            if shared in meta:
                self.options[shared] = meta[shared]
        name, key = posixpath.relpath(path, DASHBOARD_DIR), configmap_key(path)
        generator = {"name": meta["name"], "namespace": meta.get("namespace", ""),
                     "files": [name if key == name else f"{key}={name}"]}
        self.generators.append({k: v for k, v in generator.items() if v})

    def files(self) -> dict[str, str]:
        """dashboards/kustomization.yaml: a ConfigMap per dashboard for Grafana's sidecar; none without one."""
        if not self.generators:
            return {}
        head = HEADER.format(version=self.version, what="the dashboards as ConfigMaps for Grafana's dashboard "
                             "sidecar, made by kustomize from the JSON files beside it")
        doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
               "generatorOptions": self.options,
               "configMapGenerator": sorted(self.generators, key=lambda g: g["name"])}
        return {DASHBOARD_KUSTOMIZATION: head + dump(doc)}


def provider(opts: KubeOptions) -> dict:
    """A Grafana dashboard provider (provisioning/dashboards/*.yaml) reading the JSON files from a directory."""
    return {"apiVersion": 1, "providers": [{
        "name": PROVIDER_NAME, "orgId": 1, "folder": opts.folder, "type": "file", "disableDeletion": False,
        "allowUiUpdates": False, "updateIntervalSeconds": 60,
        "options": {"path": opts.provider_path, "foldersFromFilesStructure": False}}]}


def provider_file(opts: KubeOptions, version: str) -> dict[str, str]:
    head = HEADER.format(version=version, what="a Grafana dashboard provider for the JSON files in dashboards/")
    note = (f"# Copy it to Grafana's provisioning/dashboards/ and the dashboards' *.json files to {opts.provider_path}/\n"
            "# (or set --grafana-dashboards-path); Grafana reads new and changed files every updateIntervalSeconds.\n")
    return {GRAFANA_PROVIDER_FILE: head + note + "\n" + dump(provider(opts))}
