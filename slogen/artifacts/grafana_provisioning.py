"""What Grafana loads the generated dashboards from: ConfigMaps for the sidecar kube-prometheus-stack runs,
and a file-provisioning provider for a Grafana without it.

Why: the dashboards are JSON files; a Grafana in a cluster never reads a repository. The chart's sidecar
watches ConfigMaps carrying its label (`grafana_dashboard: "1"` by default) and files each under the folder
its annotation names; a Grafana without the sidecar reads dashboards from a directory a provider names.
Each ConfigMap's data is the dashboard's JSON byte for byte, so both paths load the same dashboards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import PurePosixPath

from slogen.errors import SpecError, SpecErrors
from slogen.k8smeta import MAX_CONFIGMAP_BYTES, MAX_SUBDOMAIN, KubeOptions, configmap_key_problem, subdomain_problem
from slogen.paths import DASHBOARD_CONFIGMAP_DIR, DASHBOARD_CONFIGMAPS_KUSTOMIZATION, GRAFANA_PROVIDER_FILE
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


def dashboard_configmap(path: str, text: str, opts: KubeOptions) -> dict:
    """One dashboard's ConfigMap (key: its file name, value: its JSON as written); SpecErrors when the
    API server would refuse it: a dashboard over the 1 MiB a ConfigMap holds (or, defensively, a name)."""
    name, key = configmap_name(path), configmap_key(path)
    problems = []
    if why := subdomain_problem(name):
        problems.append(SpecError(path, f"its ConfigMap name {name!r} {why}", fix="give the SLO a shorter id"))
    if why := configmap_key_problem(key):
        problems.append(SpecError(path, f"its ConfigMap key {key!r} {why}", fix="give the SLO a shorter id"))
    size = len(text.encode())
    if size > MAX_CONFIGMAP_BYTES:
        problems.append(SpecError(path, f"the dashboard is {size} bytes, more than the {MAX_CONFIGMAP_BYTES} a "
                                        "ConfigMap holds, so the sidecar cannot load it",
                                  fix="split the SLO's service into smaller services, or provision this dashboard "
                                      f"from files ({GRAFANA_PROVIDER_FILE})"))
    if problems:
        raise SpecErrors(problems)
    managed = {**K8S_LABELS, "app.kubernetes.io/component": COMPONENT}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": opts.meta.metadata(name, opts.namespace, labels=opts.dashboard_labels, managed=managed,
                                           annotations={opts.folder_annotation: opts.folder}),
            "data": {key: text}}


def configmap_path(dashboard_path: str) -> str:
    """Its ConfigMap's file: the object's name, cut to fit a file name of 255 bytes with `.yaml`."""
    return f"{DASHBOARD_CONFIGMAP_DIR}/{_fit(configmap_name(dashboard_path), 250)}.yaml"


def dashboard_configmaps(dashboards: Mapping[str, str], opts: KubeOptions, version: str) -> dict[str, str]:
    """The sidecar's ConfigMaps (dashboard path -> JSON text): a file each, and their kustomization."""
    made = DashboardConfigMaps(opts, version)
    files = {configmap_path(p): made.add(p, dashboards[p]) for p in sorted(dashboards)}
    return {**files, **made.files()}


class DashboardConfigMaps:
    """The same, one dashboard at a time as the build renders them: `add` gives the ConfigMap file's text,
    `files` the kustomization listing every one (a build holds their names, never their text)."""

    def __init__(self, opts: KubeOptions, version: str) -> None:
        self.opts, self.version = opts, version
        self.names: list[str] = []
        self.head = HEADER.format(version=version, what="a dashboard as a ConfigMap for Grafana's dashboard sidecar")

    def add(self, path: str, text: str) -> str:
        self.names.append(PurePosixPath(configmap_path(path)).name)
        return self.head + dump(dashboard_configmap(path, text, self.opts))

    def files(self) -> dict[str, str]:
        """deploy/generated/grafana/kustomization.yaml, listing the ConfigMaps; none without a dashboard."""
        if not self.names:
            return {}
        head = HEADER.format(version=self.version, what="the dashboards' ConfigMaps for Grafana's dashboard sidecar")
        doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": sorted(self.names)}
        return {DASHBOARD_CONFIGMAPS_KUSTOMIZATION: head + dump(doc)}


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
