"""Write a production overlay of deploy/ for your namespaces: `python -m tools.deploy_overlay`.

    python -m tools.deploy_overlay --inference-namespaces llm-chat,llm-batch \\
        --monitoring-namespace observability --out deploy/overlays/my-cluster

Why a generator: kustomize copies a value to many places (`replacements`), but cannot make one
object per item of a list. Each inference namespace needs its own Namespace (labelled for the
security floor), the tap's SLO ConfigMap, and the exporter's discovery Role and RoleBinding, and
the exporter's `--discovery-namespaces` flag must name exactly those namespaces. This writes an
ordinary kustomize overlay: one small kustomization per inference namespace (`namespace: <name>`
over deploy/namespaces/inference and deploy/namespaces/discovery), the values in
deploy-parameters.yaml, and `replacements` that carry them to every object that refers to them.
Commit the result and build it with `kubectl kustomize`; run this again to add a namespace.
deploy/overlays/production is this script's output for `--inference-namespaces llm`
(tests/deploy/test_namespaces.py checks it is).

It refuses (exit 2, naming the flag) a namespace name Kubernetes would refuse, and a ScaledObject in
the generated autoscalers (deploy/generated/keda) whose namespace is not one of the inference
namespaces (its pool would get autoscaling but no security floor, tap ConfigMap or discovery), or one
that asks the prometheus-operated Service of another namespace than --monitoring-namespace.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
SCALED_OBJECTS = Path("generated/keda/scaledobjects.yaml")  # under deploy/
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DEFAULT_CIDR = "10.0.0.0/16"
ZERO_DIGEST = "sha256:" + "0" * 64


class OverlayError(ValueError):
    """A setting the overlay cannot be written with; `flag` names the option to change."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class OverlayParams:
    """What differs between clusters: the engine namespaces, where Prometheus runs, the API server's CIDR."""

    inference_namespaces: tuple[str, ...]
    monitoring_namespace: str = "monitoring"
    api_server_cidr: str = DEFAULT_CIDR
    digest: str = ZERO_DIGEST


def namespace_list(value: str, flag: str = "--inference-namespaces") -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names:
        raise OverlayError(flag, "name at least one namespace, e.g. llm-chat,llm-batch")
    for n in names:
        _check_name(n, flag)
    if len(set(names)) != len(names):
        raise OverlayError(flag, f"{value!r} names a namespace twice; list each once")
    return names


def _check_name(name: str, flag: str) -> None:
    if not _DNS_LABEL.match(name):
        raise OverlayError(flag, f"{name!r} is not a Kubernetes namespace name (lowercase letters, digits and '-', "
                                 "at most 63, starting and ending with a letter or digit)")


_OPERATED = re.compile(r"//prometheus-operated\.([a-z0-9-]+)\.svc[:/]")


def check_scaled_objects(deploy: Path, namespaces: Sequence[str], monitoring: str = "monitoring") -> None:
    """OverlayError if a generated ScaledObject lives outside the inference namespaces, or asks the
    prometheus-operator Service of another namespace than the monitoring one (the pool's `prometheus:`
    in autoscaling/ sets the address; a custom one, e.g. Thanos, is left alone)."""
    path = deploy / SCALED_OBJECTS
    if not path.is_file():
        return
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if not isinstance(doc, dict) or doc.get("kind") != "ScaledObject":
            continue
        ns = doc.get("metadata", {}).get("namespace", "")
        if ns not in namespaces:
            raise OverlayError(
                "--inference-namespaces",
                f"the generated ScaledObject {doc['metadata']['name']!r} ({path}) is in namespace {ns!r}, which is not "
                f"one of {','.join(namespaces)}: its pool would scale without the security floor, the tap's SLO "
                f"ConfigMap or discovery; add {ns!r} to the list, or change the pool's namespace in autoscaling/ "
                "and run `slogen build`")
        for trigger in doc.get("spec", {}).get("triggers", []):
            address = str(trigger.get("metadata", {}).get("serverAddress", ""))
            found = _OPERATED.search(address)
            if found and found.group(1) != monitoring:
                raise OverlayError(
                    "--monitoring-namespace",
                    f"the generated ScaledObject {doc['metadata']['name']!r} ({path}) asks {address}, the Prometheus in "
                    f"namespace {found.group(1)!r}, not in {monitoring!r}; set `prometheus: "
                    f"http://prometheus-operated.{monitoring}.svc:9090` on its pool in autoscaling/ and run `slogen build`")


HEADER = ("# Written by `python -m tools.deploy_overlay {args}`.\n"
          "# Run it again to change the namespaces; edit the rest freely.\n")


def _kustomization(p: OverlayParams, up: str, args: str) -> str:
    per_ns = "\n".join(f"  - inference/{ns}" for ns in p.inference_namespaces)
    return HEADER.format(args=args) + f"""\
# Production: the exporter with the generated rules and autoscalers, the security floor
# enforced, the image pinned to the digest CI pushed, and API-server egress narrowed.
# Every inference namespace (deploy-parameters.yaml: inferenceNamespaces) gets its Namespace, the
# tap's SLO ConfigMap and the exporter's discovery Role from inference/<name>.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - deploy-parameters.yaml
  - {up}/base
{per_ns}
  - {up}/policy
  - {up}/generated
components:
  # The labels kube-prometheus-stack selects rules and monitors by (`release: ...`): edit them there.
  - {up}/components/monitoring-labels
images:
  # Replace with the digest your release pushed: `kustomize edit set image
  # ghcr.io/llmslo/llmslo=ghcr.io/llmslo/llmslo@sha256:<digest>` (docs/deploy.md).
  - name: ghcr.io/llmslo/llmslo
    digest: {p.digest}
""" + _REPLACEMENTS + _PATCHES


# The overlay's `replacements`: each value of deploy-parameters.yaml carried to the objects that use it.
_REPLACEMENTS = """\
replacements:
  # deploy-parameters.yaml: monitoringNamespace.
  - source:
      kind: ConfigMap
      name: llmslo-deploy-parameters
      fieldPath: data.monitoringNamespace
    targets:
      - select:
          kind: PrometheusRule
        fieldPaths:
          - metadata.namespace
        options:
          create: true
      # the routing and the dashboards' ConfigMaps go where Alertmanager and Grafana's sidecar look
      - select:
          kind: AlertmanagerConfig
        fieldPaths:
          - metadata.namespace
        options:
          create: true
      - select:
          kind: ConfigMap
          labelSelector: app.kubernetes.io/component=dashboard
        fieldPaths:
          - metadata.namespace
        options:
          create: true
      - select:
          kind: NetworkPolicy
          name: llmslo-exporter
        fieldPaths:
          - spec.ingress.0.from.0.namespaceSelector.matchLabels.[kubernetes.io/metadata.name]
  # deploy-parameters.yaml: inferenceNamespaces, the namespaces discovery watches (a Role in each).
  - source:
      kind: ConfigMap
      name: llmslo-deploy-parameters
      fieldPath: data.inferenceNamespaces
    targets:
      - select:
          kind: DaemonSet
          name: llmslo-exporter
        fieldPaths:
          - spec.template.spec.containers.[name=exporter].args.2
        options:
          delimiter: "="
          index: 1
  # deploy-parameters.yaml: apiServerCIDR.
  - source:
      kind: ConfigMap
      name: llmslo-deploy-parameters
      fieldPath: data.apiServerCIDR
    targets:
      - select:
          kind: NetworkPolicy
          name: llmslo-exporter
        fieldPaths:
          - spec.egress.1.to.0.ipBlock.cidr
"""

# The overlay's `patches`: discovery narrowed to the inference namespaces, the exporter's resources.
_PATCHES = """\
patches:
  # Discovery watches the inference namespaces only (docs/deploy.md, threat notes): the flag names
  # them, inference/<name> grants a Role in each, and the base's cluster-wide grant goes.
  - patch: |-
      $patch: delete
      apiVersion: rbac.authorization.k8s.io/v1
      kind: ClusterRole
      metadata:
        name: llmslo-exporter
  - patch: |-
      $patch: delete
      apiVersion: rbac.authorization.k8s.io/v1
      kind: ClusterRoleBinding
      metadata:
        name: llmslo-exporter
  - target:
      kind: DaemonSet
      name: llmslo-exporter
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --discovery-namespaces=set-by-replacements
      - op: replace
        path: /spec/template/spec/containers/0/resources
        value:
          requests: {cpu: 100m, memory: 128Mi}
          limits: {cpu: "1", memory: 512Mi}
  - target:
      kind: NetworkPolicy
      name: llmslo-exporter
    patch: |-
      # Engine metrics only in the inference namespaces (labelled llmslo.io/inference by
      # deploy/namespaces/inference), whichever and however many they are.
      - op: replace
        path: /spec/egress/0/to/0/namespaceSelector
        value:
          matchLabels:
            llmslo.io/inference: "true"
"""


def _parameters(p: OverlayParams, args: str) -> str:
    return HEADER.format(args=args) + f"""\
# What this overlay refers to but does not create, in one place. A kustomize-only object
# (local-config: never applied); the overlay's `replacements` copy each value where it is used.
apiVersion: v1
kind: ConfigMap
metadata:
  name: llmslo-deploy-parameters
  annotations:
    config.kubernetes.io/local-config: "true"
data:
  # The namespace your Prometheus stack runs in; it must exist (the Prometheus stack creates it,
  # so it is not shipped here: removing this overlay must not delete your monitoring). The
  # PrometheusRules go there (prometheus-operator's ruleNamespaceSelector must select it) and the
  # exporter's NetworkPolicy admits Prometheus pods from it. (The ScaledObjects' Prometheus address is
  # each pool's `prometheus:` in autoscaling/; the generator checks it points here.)
  monitoringNamespace: {p.monitoring_namespace}
  # The engines' namespaces, comma-separated: the exporter's --discovery-namespaces. Each one also
  # needs inference/<name> in this overlay (tools.deploy_overlay writes both).
  inferenceNamespaces: {",".join(p.inference_namespaces)}
  # Your control plane's endpoints (`kubectl get endpoints kubernetes -n default`): the exporter's
  # only egress besides the engines' metrics ports.
  apiServerCIDR: {p.api_server_cidr}
"""


def _namespace(ns: str, up: str, args: str) -> str:
    return HEADER.format(args=args) + f"""\
# Inference namespace {ns}: the Namespace (labelled for the security floor), the tap's SLO
# ConfigMap, and the exporter's discovery Role and RoleBinding, all in {ns}.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: {ns}
resources:
  - {up}/namespaces/inference
  - {up}/namespaces/discovery
"""


def render(p: OverlayParams, out: Path, deploy: Path = DEPLOY) -> dict[str, str]:
    """Relative path under `out` -> text: the overlay for `p`, referring to `deploy` by relative paths."""
    for ns in p.inference_namespaces:
        _check_name(ns, "--inference-namespaces")
    _check_name(p.monitoring_namespace, "--monitoring-namespace")
    check_scaled_objects(deploy, p.inference_namespaces, p.monitoring_namespace)
    args = f"--inference-namespaces {','.join(p.inference_namespaces)}"
    if p.monitoring_namespace != "monitoring":
        args += f" --monitoring-namespace {p.monitoring_namespace}"
    if p.api_server_cidr != DEFAULT_CIDR:
        args += f" --api-server-cidr {p.api_server_cidr}"
    up = Path(os.path.relpath(deploy.resolve(), out.resolve())).as_posix()
    files = {"kustomization.yaml": _kustomization(p, up, args), "deploy-parameters.yaml": _parameters(p, args)}
    for ns in p.inference_namespaces:
        files[f"inference/{ns}/kustomization.yaml"] = _namespace(ns, "../../" + up, args)
    return files


def write(files: dict[str, str], out: Path) -> None:
    """Write the overlay; inference/<name> directories of namespaces no longer listed are removed."""
    inference = out / "inference"
    keep = {Path(rel).parts[1] for rel in files if rel.startswith("inference/")}
    if inference.is_dir():
        for old in inference.iterdir():
            if old.name not in keep and (old / "kustomization.yaml").is_file():
                (old / "kustomization.yaml").unlink()
                if not any(old.iterdir()):
                    old.rmdir()
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.deploy_overlay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--inference-namespaces", required=True, metavar="NS[,NS...]",
                        help="the namespaces your engines (and their taps and ScaledObjects) run in")
    parser.add_argument("--monitoring-namespace", default="monitoring", metavar="NS",
                        help="where Prometheus (prometheus-operator) runs and the PrometheusRules go (default monitoring)")
    parser.add_argument("--api-server-cidr", default=DEFAULT_CIDR, metavar="CIDR",
                        help=f"the API server's endpoints, the exporter's egress for discovery (default {DEFAULT_CIDR})")
    parser.add_argument("--out", required=True, metavar="DIR", help="the overlay directory to write")
    parser.add_argument("--deploy", default=str(DEPLOY), metavar="DIR",
                        help="the deploy/ tree the overlay builds on, with `slogen build`'s deploy/generated "
                             "(default: this checkout's)")
    args = parser.parse_args(argv)
    try:
        params = OverlayParams(namespace_list(args.inference_namespaces), args.monitoring_namespace,
                               args.api_server_cidr)
        deploy = Path(args.deploy)
        if not (deploy / "base" / "kustomization.yaml").is_file():
            raise OverlayError("--deploy", f"{deploy} has no base/kustomization.yaml; name the deploy/ directory")
        files = render(params, Path(args.out), deploy)
    except OverlayError as e:
        print(f"python -m tools.deploy_overlay: {e}", file=sys.stderr)
        return 2
    write(files, Path(args.out))
    print(f"wrote {len(files)} files to {args.out}: kubectl kustomize {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
