"""What every generated Kubernetes object carries besides its own fields: the build's object labels and
annotations (`slogen build --object-label/--object-annotation`), checked as the API server checks them.

Why a build setting: kube-prometheus-stack's Prometheus selects PrometheusRules, PodMonitors and
ServiceMonitors by a label (`release: <Helm release>` by default); an object without it is silently
ignored. One setting puts it on every object the build writes (PrometheusRules, ScaledObjects, HPAs,
ConfigMaps, the AlertmanagerConfig), so no kind is forgotten.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# Kubernetes' own rules (apimachinery validation: IsQualifiedName, IsValidLabelValue, IsDNS1123Subdomain).
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
MAX_NAME_PART = 63
MAX_SUBDOMAIN = 253
MAX_LABEL_VALUE = 63
MAX_ANNOTATIONS_BYTES = 256 * 1024  # the API server's limit on all of an object's annotations together
MAX_CONFIGMAP_BYTES = 1024 * 1024  # the API server's limit on a ConfigMap's data
# The labels slogen sets on its objects itself (`slogen.writers.K8S_LABELS`); a build setting may not change them.
MANAGED_LABEL_KEYS = frozenset({"app.kubernetes.io/component", "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of"})


def _pattern_problem(text: str, limit: int, pattern: re.Pattern[str], rule: str) -> str | None:
    """Why `text` is longer than `limit` or does not match `pattern` (`rule` says what it must be), or None."""
    if len(text) > limit:
        return f"is {len(text)} characters, more than {limit}"
    return None if pattern.fullmatch(text) else rule  # fullmatch: `$` alone lets a trailing newline through


def subdomain_problem(name: str) -> str | None:
    """Why `name` is not a DNS-1123 subdomain (object names, label-key prefixes), or None."""
    return _pattern_problem(name, MAX_SUBDOMAIN, _DNS1123_SUBDOMAIN,
                            "must be lowercase letters, digits, '-' and '.', starting and ending with a letter or digit")


def object_name(name: str) -> str:
    """`name` when it is a valid object name (a DNS-1123 subdomain), else one derived from it: lowercase, each run
    of other characters as '-', no '-' or '.' next to a '.', plus '-' and 8 hex digits of the name's sha256, so
    names differing only in case or punctuation (`Pay_API`, `pay-api`) still get distinct objects. The
    derivation is deterministic: a rebuild names the object the same."""
    if subdomain_problem(name) is None:
        return name
    base = re.sub(r"[^a-z0-9.]+", "-", name.lower())
    base = re.sub(r"[-.]*\.[-.]*", ".", base).strip("-.")[: MAX_SUBDOMAIN - 9].strip("-.")
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{base}-{digest}" if base else digest


def namespace_problem(name: str) -> str | None:
    """Why `name` is not a valid namespace name (a DNS-1123 label), or None."""
    return _pattern_problem(name, MAX_NAME_PART, _DNS1123_LABEL,
                            "must be lowercase letters, digits and '-', starting and ending with a letter or digit")


def webhook_url_problem(url: str) -> str | None:
    """Why `url` is not an http(s) URL with a host, as an Alertmanager webhook_config takes it, or None."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a port that is not a number
    except ValueError as e:
        return f"is not a URL ({e})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http:// or https:// URL with a host"
    if any(ch.isspace() for ch in url):
        return "contains whitespace"
    return None


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a valid label or annotation key ([prefix/]name), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "has an empty prefix before '/'"
    if prefix and (why := subdomain_problem(prefix)):
        return f"prefix {prefix!r} {why}"
    if not name or len(name) > MAX_NAME_PART:
        return f"name part {name!r} must be 1-{MAX_NAME_PART} characters"
    if not _NAME_PART.match(name):
        return f"name part {name!r} must be letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value, or None (empty is valid)."""
    return _pattern_problem(value, MAX_LABEL_VALUE, _LABEL_VALUE,
                            "must be letters, digits, '-', '_' and '.', starting and ending with a letter or digit")


def configmap_key_problem(key: str) -> str | None:
    if not key or len(key) > MAX_SUBDOMAIN or not _CONFIGMAP_KEY.match(key) or key in (".", ".."):
        return f"must be 1-{MAX_SUBDOMAIN} of letters, digits, '-', '_' and '.'"
    return None


def label_problems(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """(key=value, why) of each label the API server would refuse."""
    out = []
    for key, value in labels.items():
        why = qualified_name_problem(key)
        if why:
            out.append((f"{key}={value}", f"key {key!r} {why}"))
        elif why := label_value_problem(value):
            out.append((f"{key}={value}", f"value {value!r} {why}"))
    return out


def annotation_problems(annotations: Mapping[str, str]) -> list[tuple[str, str]]:
    """(key=value, why) of each annotation the API server would refuse (keys; the total size)."""
    out = [(f"{k}={v}", f"key {k!r} {why}") for k, v in annotations.items() if (why := qualified_name_problem(k))]
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        out.append(("(all)", f"the annotations are {size} bytes together, more than {MAX_ANNOTATIONS_BYTES}"))
    return out


@dataclass(frozen=True)
class ObjectMeta:
    """Labels and annotations for every generated Kubernetes object. The generator's own labels (what
    slogen manages, e.g. `app.kubernetes.io/managed-by`) win over these; the build refuses a clash."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def metadata(self, name: str, namespace: str = "", labels: Mapping[str, str] | None = None,
                 annotations: Mapping[str, str] | None = None, managed: Mapping[str, str] | None = None) -> dict:
        """An object's metadata: `labels`/`annotations` (the object's own, e.g. from its spec) under the
        build's, under the `managed` labels slogen sets; keys sorted, so output is deterministic."""
        meta: dict = {"name": object_name(name)}
        if namespace:
            meta["namespace"] = namespace
        merged = {**(labels or {}), **self.labels, **(managed or {})}
        if merged:
            meta["labels"] = dict(sorted(merged.items()))
        notes = {**(annotations or {}), **self.annotations}
        if notes:
            meta["annotations"] = dict(sorted(notes.items()))
        return meta


NO_META = ObjectMeta()


# kube-prometheus-stack's Grafana sidecar loads ConfigMaps carrying this label (its `sidecar.dashboards.label`
# and `labelValue` defaults) into the folder its `folderAnnotation` names.
DEFAULT_DASHBOARD_LABELS = {"grafana_dashboard": "1"}
DEFAULT_FOLDER_ANNOTATION = "grafana_folder"
DEFAULT_DASHBOARD_FOLDER = "LLM SLOs"
DEFAULT_PROVIDER_PATH = "/var/lib/grafana/dashboards/llmslo"
DEFAULT_ALERTMANAGER_CONFIG = "llmslo"


@dataclass(frozen=True)
class KubeOptions:
    """The build's Kubernetes settings: what every object carries, how Grafana finds the dashboards
    (the sidecar's label and folder annotation, the file provider's path) and the AlertmanagerConfig's name."""

    meta: ObjectMeta = NO_META
    dashboard_labels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_DASHBOARD_LABELS))
    folder_annotation: str = DEFAULT_FOLDER_ANNOTATION
    folder: str = DEFAULT_DASHBOARD_FOLDER
    provider_path: str = DEFAULT_PROVIDER_PATH
    alertmanager_config_name: str = DEFAULT_ALERTMANAGER_CONFIG
    # The namespace the monitoring objects (PrometheusRules, dashboard ConfigMaps, AlertmanagerConfig) live in.
    # Set, every generated alert carries the static label namespace=<it>, which prometheus-operator's default
    # alertmanagerConfigMatcherStrategy (OnNamespace) requires of the alerts an AlertmanagerConfig routes; an
    # alert whose series had a namespace keeps it as exported_namespace (slogen.rules.scope).
    namespace: str = ""
    # Alertmanager receiver name -> webhook URL (slogen.artifacts.alertmanager): llmslo-page, llmslo-ticket and
    # one per SLO `team` label. None given: the routing's receivers are placeholders, and the build warns.
    receivers: Mapping[str, str] = field(default_factory=dict)

    def problems(self) -> list[tuple[str, str]]:
        """(flag, why) for each setting the API server or Grafana would refuse."""
        out = [("--object-label", f"{kv}: {why}") for kv, why in label_problems(self.meta.labels)]
        out += [("--object-label", f"{k}: slogen sets this label itself; choose another key")
                for k in self.meta.labels if k in MANAGED_LABEL_KEYS]
        out += [("--object-annotation", f"{kv}: {why}") for kv, why in annotation_problems(self.meta.annotations)]
        out += [("--dashboard-label", f"{kv}: {why}") for kv, why in label_problems(self.dashboard_labels)]
        out += [("--object-label", f"{k}={v} conflicts with --dashboard-label {k}={self.dashboard_labels[k]}: both "
                                   "label the dashboards' ConfigMaps; give the key one value")
                for k, v in self.meta.labels.items() if self.dashboard_labels.get(k, v) != v]
        if why := qualified_name_problem(self.folder_annotation):
            out.append(("--dashboard-folder-annotation", f"{self.folder_annotation!r}: {why}"))
        if not self.folder.strip():
            out.append(("--dashboard-folder", "is empty"))
        if not self.provider_path.startswith("/"):
            out.append(("--grafana-dashboards-path", f"{self.provider_path!r} is not an absolute path"))
        if why := subdomain_problem(self.alertmanager_config_name):
            out.append(("--alertmanager-config-name", f"{self.alertmanager_config_name!r} {why}"))
        if self.namespace and (why := namespace_problem(self.namespace)):
            out.append(("--namespace", f"{self.namespace!r} {why}"))
        for name, url in self.receivers.items():
            if not name.strip() or name != name.strip():
                out.append(("--receiver", f"{name!r}: a receiver name must be non-empty, without surrounding spaces"))
            elif why := webhook_url_problem(url):
                out.append(("--receiver", f"{name}={url}: the URL {why}"))
        return out
