"""JSON Schemas for custom resources, made from the CRDs in ../shared/schemas, unknown fields rejected.

A CRD's openAPIV3Schema leaves objects open unless told otherwise; the API server prunes
unknown fields instead of rejecting them, so a misspelt `scaleTargetRef` would be silently
dropped in a cluster. Here every object schema that lists `properties` (and is not marked
`x-kubernetes-preserve-unknown-fields`) gets `additionalProperties: false`, so such a typo
fails the test. `x-kubernetes-int-or-string` becomes an integer-or-string type.

Shared by tests/artifacts and tests/deploy (loaded by path from their conftest files).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from slogen.yamlio import ManifestLoader

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
SCHEMAS = SHARED / "schemas"

CRD_FILES = {
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheus-operator/monitoring.coreos.com_prometheusrules.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "prometheus-operator/monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "prometheus-operator/monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"):
        "prometheus-operator/monitoring.coreos.com_alertmanagerconfigs.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "keda/keda.sh_scaledobjects.yaml",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda/keda.sh_triggerauthentications.yaml",
}


Loader = ManifestLoader  # the loader slogen reads rendered manifests with


def load_all(text: str) -> list[Any]:
    """The documents of a YAML stream (empty ones dropped), read as `Loader` reads them."""
    return [d for d in yaml.load_all(text, Loader=Loader) if d is not None]


def strict(schema: Any) -> Any:
    """A copy of an openAPIV3Schema with unknown fields rejected everywhere they can be."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("x-kubernetes-int-or-string") and "type" not in node and "anyOf" not in node:
                node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.load((SCHEMAS / CRD_FILES[(api_version, kind)]).read_text(), Loader=Loader)
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    served = [v for v in crd["spec"]["versions"] if v["name"] == version and v.get("served")]
    assert served, f"{api_version} {kind} is not served by the CRD"
    schema = strict(served[0]["schema"]["openAPIV3Schema"])
    # apiVersion and kind are free strings in the CRD; pin them to this version and kind.
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema.setdefault("required", [])
    schema["required"] = sorted(set(schema["required"]) | {"apiVersion", "kind", "metadata", "spec"})
    return schema


def crd_errors(obj: dict[str, Any]) -> list[str]:
    """Validation errors of one custom resource, as `path: message` strings (empty when valid)."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in CRD_FILES:
        return [f"no CRD known for {key}"]
    validator = jsonschema.Draft7Validator(crd_schema(*key))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(obj)]


def is_custom(obj: dict[str, Any]) -> bool:
    return (obj.get("apiVersion"), obj.get("kind")) in CRD_FILES
