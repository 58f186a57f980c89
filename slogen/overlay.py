"""The install as a kustomize overlay, from the install's settings: `slogen overlay`, and `slogen build` in a
repository `slogen init` made.

Why a generator: kustomize copies a value to many places but cannot make one object per item of a list.
Each inference namespace needs the tap's SLO ConfigMap and the exporter's discovery Role and RoleBinding
(and, with the floor on, its Namespace labels), and the exporter's `--discovery-namespaces` flag and
NetworkPolicy must name exactly those namespaces. So the settings (slogen.settings) are written straight into
ordinary kustomizations over the shipped bases (slogen/kustomize, package data):

    OUT/kustomization.yaml          the labels on every object, the image by digest, the floor's mode
    OUT/exporter/                   the exporter in the settings' namespace, discovery narrowed to the engines;
                                    with `isolation:`, one DaemonSet per named pool (pool-<name>.yaml)
    OUT/podmap/                     the relay that reads the kubelet's socket, in llmslo-node, for that exporter
    OUT/inference/<ns>/             the tap's ConfigMap and the discovery Role (and the Namespace, floor on)
    OUT/floor/                      the admission policy and image-signature policies (floor audit or enforce)
    OUT/tap-injector/               the webhook adding the tap to the pods that opt in (`tapInjector: true`)

The floor is opt-in: `off` adds no policy and no label to anyone's namespace; `audit` warns and audits
(the floor-audit component: Pod Security warn/audit, the policy binding's Warn and Audit, ClusterImagePolicy
mode warn); `enforce` is the shipped policy as it is (Pod Security enforce, Deny, mode enforce).

A label the settings give is checked against the generated objects: a generated object that carries the
key with another value is refused with both values named, never silently overwritten.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

import yaml

from llmslo.files import write_atomic
from slogen.k8smeta import object_name
from slogen.poolisolation import Isolation
from slogen.settings import IMAGE_NAME, InstallSettings
from slogen.writers import GENERATED_MARKER

BASES = Path(__file__).resolve().parent / "kustomize"  # shipped with the package
AUDIT_COMPONENT = "components/floor-audit"
TAP_INJECTOR = "tap-injector"  # the base's directory and the overlay's (its objects name their own namespace)


class OverlayError(ValueError):
    """A setting the overlay cannot be written with; `flag` names the option to change."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


_OPERATED = re.compile(r"//prometheus-operated\.([a-z0-9-]+)\.svc[:/]")


def generated_objects(files: Iterable[tuple[str, str]]) -> list[tuple[str, dict]]:
    """(file, object) of each Kubernetes object in the (path, text) of the build's deploy/generated files."""
    out = []
    for path, text in files:
        if not path.endswith("kustomization.yaml"):
            out += [(path, doc) for doc in yaml.safe_load_all(text) if isinstance(doc, dict) and "kind" in doc]
    return out


def on_disk(generated: Path) -> list[tuple[str, str]]:
    return [(str(p), p.read_text(encoding="utf-8")) for p in sorted(generated.rglob("*.yaml"))]


def check_generated(objects: Iterable[tuple[str, dict]], s: InstallSettings) -> None:
    """OverlayError if the build's objects disagree with the settings: a ScaledObject outside the inference
    namespaces (its pool would scale with no tap ConfigMap or discovery) or asking another namespace's
    Prometheus, or an object carrying one of the settings' label keys with another value."""
    for path, doc in objects:
        meta = doc.get("metadata", {})
        name = f"{doc['kind']} {meta.get('name')!r} ({path})"
        for key, value in s.object_labels.items():
            theirs = (meta.get("labels") or {}).get(key)
            if theirs is not None and theirs != value:
                raise OverlayError("--object-label", f"{key}={value} conflicts with {key}={theirs} on the generated "
                                                     f"{name}: run `slogen build` with the same labels (one place: "
                                                     "llmslo.yaml objectLabels)")
        if doc["kind"] != "ScaledObject":
            continue
        ns = meta.get("namespace", "")
        if ns not in s.inference_namespaces:
            raise OverlayError("--inference-namespace", f"the generated {name} is in namespace {ns!r}, not one of "
                               f"{','.join(s.inference_namespaces)}: its pool would scale without the tap's SLO "
                               f"ConfigMap or discovery; add {ns!r}, or change the pool's namespace in autoscaling/ "
                               "and run `slogen build`")
        for trigger in doc.get("spec", {}).get("triggers", []):
            address = str(trigger.get("metadata", {}).get("serverAddress", ""))
            found = _OPERATED.search(address)
            if found and found.group(1) != s.namespace:
                raise OverlayError("--namespace", f"the generated {name} asks {address}, the Prometheus in namespace "
                                   f"{found.group(1)!r}, not in {s.namespace!r}; set `prometheus: http://prometheus-"
                                   f"operated.{s.namespace}.svc:9090` on its pool in autoscaling/ and run `slogen build`")


def _dump(header: str, obj: dict) -> str:
    return header + yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=120)


def _kustomization(**fields) -> dict:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", **fields}


def _json_patch(kind: str, name: str, ops: list[dict]) -> dict:
    return {"target": {"kind": kind, "name": name}, "patch": yaml.safe_dump(ops, sort_keys=False, width=120)}


def _top(s: InstallSettings, generated: str, bases: str) -> dict:
    resources = ["exporter", "podmap", *(f"inference/{ns}" for ns in s.inference_namespaces), generated]
    if s.floor != "off":
        resources.append("floor")
    if s.tap_injector:
        resources.append(TAP_INJECTOR)
    image = {"name": IMAGE_NAME, "digest": s.image_digest}
    if s.image_name != IMAGE_NAME:
        image["newName"] = s.image_name
    k = _kustomization(resources=resources)
    if s.floor == "audit":  # on the whole install: the policy binding, the image policies, the Namespaces
        k["components"] = [f"{bases}/{AUDIT_COMPONENT}"]
    if s.object_labels:
        k["labels"] = [{"pairs": dict(sorted(s.object_labels.items())), "includeSelectors": False}]
    k["images"] = [image]
    return k


EXPORTER = "llmslo-exporter"
POOL_POD_LABEL = "llmslo.io/node-pool"  # on a pool DaemonSet's pods: tells the DaemonSets' pods apart
POOL_ENV = "LLMSLO_NODE_POOL"  # exporter/config.py NODE_POOL_ENV (slogen does not import the exporter)


def _discovery_arg(s: InstallSettings) -> str:
    return f"--discovery-namespaces={','.join(s.inference_namespaces)}"


def pool_file(pool: str) -> str:
    return f"pool-{object_name(pool)}.yaml"


def pool_daemonset(iso: Isolation, pool: str, s: InstallSettings, bases: Path = BASES) -> dict:
    """The exporter DaemonSet of one named pool: the shipped one, on the nodes whose `nodeLabel` is `pool` (tolerating
    the pool's taint, whatever its effect), told the pool ($LLMSLO_NODE_POOL). The scheduler keeps the two in step: a
    node relabelled out of the pool loses this DaemonSet's pod and gets the shipped one's."""
    ds = copy.deepcopy(yaml.safe_load((bases / "base" / "daemonset.yaml").read_text(encoding="utf-8")))
    ds["metadata"]["name"] = object_name(f"{EXPORTER}-{pool}")
    ds["metadata"]["labels"][POOL_POD_LABEL] = pool
    ds["spec"]["selector"]["matchLabels"][POOL_POD_LABEL] = pool
    spec = ds["spec"]["template"]["spec"]
    ds["spec"]["template"]["metadata"]["labels"][POOL_POD_LABEL] = pool
    spec["nodeSelector"][iso.node_label] = pool
    spec["tolerations"].append({"key": iso.node_label, "operator": "Exists"})
    container = spec["containers"][0]
    container["args"].append(_discovery_arg(s))
    container["env"].append({"name": POOL_ENV, "value": pool})
    return ds


def _outside_pools(iso: Isolation) -> list[dict]:
    """The shipped DaemonSet kept off every named pool's nodes (each has its own): told no pool, it says none."""
    term = {"matchExpressions": [{"key": iso.node_label, "operator": "NotIn", "values": list(iso.pools)}]}
    return [{"op": "add", "path": "/spec/template/spec/affinity",
             "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}}]


def _exporter(s: InstallSettings, bases: str) -> dict:
    """The exporter's base in the settings' namespace, discovery narrowed to the inference namespaces; with
    `isolation:`, a DaemonSet per named pool beside it (pool_daemonset), the shipped one kept off their nodes."""
    namespaces = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(s.inference_namespaces)}
    iso = s.isolation
    pools = [pool_file(p) for p in iso.pools] if iso else []
    return _kustomization(namespace=s.namespace, resources=[f"{bases}/base", *pools], patches=[
        {"patch": "$patch: delete\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n"
                  "metadata:\n  name: llmslo-exporter\n"},
        {"patch": "$patch: delete\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n"
                  "metadata:\n  name: llmslo-exporter\n"},
        _json_patch("DaemonSet", EXPORTER, [
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": _discovery_arg(s)},
            *(_outside_pools(iso) if iso else [])]),
        _json_patch("NetworkPolicy", "llmslo-exporter", [
            {"op": "replace", "path": "/spec/ingress/0/from/0/namespaceSelector",
             "value": {"matchLabels": {"kubernetes.io/metadata.name": s.namespace}}},
            {"op": "replace", "path": "/spec/egress/0/to/0/namespaceSelector",
             "value": {"matchExpressions": [namespaces]}},
            {"op": "replace", "path": "/spec/egress/1/to/0/ipBlock/cidr", "value": s.api_server_cidr}]),
    ])


def _podmap(s: InstallSettings, bases: str) -> dict:
    """The podmap relay in its own namespace, admitting the exporter from the settings' namespace; with `isolation:`,
    tolerating the pools' taint (without its relay, a tainted pool's GPUs would have no holders, and no alert)."""
    patches = [_json_patch("NetworkPolicy", "llmslo-podmap", [
        {"op": "replace", "path": "/spec/ingress/0/from/0/namespaceSelector",
         "value": {"matchLabels": {"kubernetes.io/metadata.name": s.namespace}}}])]
    if s.isolation:
        patches.append(_json_patch("DaemonSet", "llmslo-podmap", [
            {"op": "add", "path": "/spec/template/spec/tolerations/-",
             "value": {"key": s.isolation.node_label, "operator": "Exists"}}]))
    return _kustomization(resources=[f"{bases}/podmap"], patches=patches)


def _tap_injector(s: InstallSettings, bases: str) -> dict:
    """The tap injector, its counters readable by Prometheus in the settings' namespace (the base names
    `monitoring`)."""
    return _kustomization(resources=[f"{bases}/{TAP_INJECTOR}"], patches=[
        _json_patch("NetworkPolicy", "llmslo-tap-injector", [
            {"op": "replace", "path": "/spec/ingress/1/from/0/namespaceSelector",
             "value": {"matchLabels": {"kubernetes.io/metadata.name": s.namespace}}}])])


def _inference(s: InstallSettings, ns: str, generated: str, bases: str) -> dict:
    resources = [f"{bases}/namespaces/discovery", f"{generated}/tap"]
    if s.floor != "off":  # the Namespace only carries the floor's labels; with the floor off it is left alone
        resources.insert(0, f"{bases}/namespaces/inference")
    return _kustomization(namespace=ns, resources=resources, patches=[
        _json_patch("RoleBinding", "llmslo-exporter", [
            {"op": "replace", "path": "/subjects/0/namespace", "value": s.namespace}])])


HEADER = f"# {GENERATED_MARKER} (`slogen {{command}}`) from the install's settings. DO NOT EDIT: change\n" \
         "# llmslo.yaml (or the flags) and run it again; put your own patches in a kustomization that includes this one.\n"


def render(s: InstallSettings, generated: str, bases: str, command: str = "overlay") -> dict[str, str]:
    """Relative path under the overlay directory -> text: the install for `s`. `generated` (slogen build's
    deploy/generated) and `bases` (the shipped kustomize bases) are paths relative to the overlay directory."""
    if not s.inference_namespaces:
        raise OverlayError("--inference-namespace", "name at least one namespace your engines run in, e.g. llm")
    head = HEADER.format(command=command)
    files = {"kustomization.yaml": _dump(head, _top(s, generated, bases)),
             "exporter/kustomization.yaml": _dump(head, _exporter(s, f"../{bases}")),
             "podmap/kustomization.yaml": _dump(head, _podmap(s, f"../{bases}"))}
    if s.isolation is not None:
        for pool in s.isolation.pools:
            files[f"exporter/{pool_file(pool)}"] = _dump(head, pool_daemonset(s.isolation, pool, s))
    for ns in s.inference_namespaces:
        files[f"inference/{ns}/kustomization.yaml"] = _dump(head, _inference(s, ns, f"../../{generated}", f"../../{bases}"))
    if s.floor != "off":
        files["floor/kustomization.yaml"] = _dump(head, _kustomization(resources=[f"../{bases}/policy"]))
    if s.tap_injector:  # the install's image and labels reach it from the top kustomization
        files[f"{TAP_INJECTOR}/kustomization.yaml"] = _dump(head, _tap_injector(s, f"../{bases}"))
    return files


def relative(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()


def write(files: dict[str, str], out: Path) -> None:
    """Write the overlay; the directories of inference namespaces no longer listed, and a floor or tap injector
    turned off, are removed (only what this writer made: a directory holding its kustomization.yaml alone)."""
    keep = {str(Path(rel).parent) for rel in files}
    for pool in (out / "exporter").glob("pool-*.yaml"):  # a pool no longer named
        if pool.relative_to(out).as_posix() not in files and GENERATED_MARKER in pool.read_text(encoding="utf-8"):
            pool.unlink()
    for old in [*(out / "inference").glob("*"), out / "floor", out / TAP_INJECTOR]:
        rel = old.relative_to(out).as_posix()
        if old.is_dir() and rel not in keep and [p.name for p in old.iterdir()] == ["kustomization.yaml"]:
            shutil.rmtree(old)
    for rel, text in files.items():
        write_atomic(out / rel, text)


def bases_files(bases: Path = BASES) -> dict[str, str]:
    """The shipped bases as relative path -> text, each marked as copied (what `slogen build` puts under
    deploy/install/bases: the user's repository holds the very install it deploys)."""
    head = f"# {GENERATED_MARKER}: copied from the llmslo package's kustomize bases. DO NOT EDIT: patch it from your\n" \
           "# own kustomization; `slogen build` copies it again from the installed package.\n"
    return {src.relative_to(bases).as_posix(): head + src.read_text(encoding="utf-8")
            for src in sorted(bases.rglob("*.yaml"))}


__all__ = ["BASES", "OverlayError", "bases_files", "check_generated", "relative", "render", "write"]

