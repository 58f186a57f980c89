"""The generated half of deploy/: the kustomization of deploy/generated and the tap's SLO ConfigMap.

Why generated: the overlays must deploy exactly the PrometheusRules and ScaledObjects this build
wrote (the kustomization lists them), and the tap must read exactly the SLO specs those rules
came from (its latency thresholds have to be the rules' bucket edges). Writing both from the
same build keeps them from drifting apart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import yaml

from slogen.k8smeta import NO_META, ObjectMeta
from slogen.paths import PROMETHEUS_RULE_DIR
from slogen.writers import GENERATED_MARKER

GENERATED_DIR = PROMETHEUS_RULE_DIR
KUSTOMIZATION = f"{GENERATED_DIR}/kustomization.yaml"
TAP_SLO_CONFIG = "deploy/examples/inference/slo-config.generated.yaml"
TAP_CONFIGMAP = "llmslo-slos"  # mounted by the tap sidecar at /etc/llmslo/slos
HEADER = f"# {GENERATED_MARKER}. DO NOT EDIT: change slos/ or autoscaling/ and run `slogen build`.\n"
_KEY = re.compile(r"[^-._a-zA-Z0-9]")


def _dump(obj: object) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=120)


def tap_slo_config(spec_files: Mapping[str, str], meta: ObjectMeta = NO_META) -> str:
    """A ConfigMap holding the SLO spec files (key: the file's path with `/` as `_`), for the tap."""
    data = {_KEY.sub("_", path.replace("/", "_")): text for path, text in sorted(spec_files.items())}
    obj = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": meta.metadata(TAP_CONFIGMAP, managed={"app.kubernetes.io/managed-by": "slogen"}),
           "data": data}
    return HEADER + _dump(obj)


def kustomization(resources: Sequence[str]) -> str:
    obj = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
           "resources": [r.removeprefix(GENERATED_DIR + "/") for r in resources]}
    return HEADER + _dump(obj)


def deploy_files(generated: Sequence[str], spec_files: Mapping[str, str], meta: ObjectMeta = NO_META) -> dict[str, str]:
    """Relative path -> text: the kustomization listing the generated objects, and the tap's ConfigMap."""
    return {KUSTOMIZATION: kustomization(sorted(generated)), TAP_SLO_CONFIG: tap_slo_config(spec_files, meta)}
