"""deploy/: every overlay builds, every object validates, and the security floor holds."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from exporter.cli import build_parser
from exporter.config import DEFAULT_PORT, ExporterConfig, KubernetesDiscovery, load_config, merge_cli

from .conftest import custom_kinds

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
# Oldest Kubernetes with admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, and the newest
# kubernetes-validate ships schemas for.
K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict], kind: str, name: str) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    out = []
    for o in objects:
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            out.append((f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"]))
    return out


def test_every_overlay_builds(built):
    assert set(built) >= {"dev", "production"}
    for name, objects in built.items():
        kinds = {o["kind"] for o in objects}
        assert {"DaemonSet", "ServiceAccount", "NetworkPolicy", "PodMonitor",
                "ConfigMap", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds, name
        assert {"ClusterRole", "ClusterRoleBinding"} <= kinds or {"Role", "RoleBinding"} <= kinds, name


def test_core_objects_validate_with_kubernetes_validate(built):
    checked = 0
    for name, objects in built.items():
        for obj in objects:
            # Custom resources: their CRDs validate them (test_custom_resources_..., test_image_signatures).
            if obj["apiVersion"].split("/")[0] in ("monitoring.coreos.com", "keda.sh", "policy.sigstore.dev"):
                continue
            for version in K8S_VERSIONS:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    pytest.fail(f"{name}: {obj['kind']}/{obj['metadata']['name']} on {version}: {e.message}")
                checked += 1
    assert checked > 20


def test_kubernetes_validate_has_teeth():
    bad = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x"},
           "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c", "imagee": "x"}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


def test_custom_resources_validate_against_their_crds(built, crd):
    seen = set().union(*(custom_kinds(crd, objects, f"{name}: ") for name, objects in built.items()))
    assert {"PodMonitor", "PrometheusRule", "ScaledObject"} <= seen


def test_exporter_daemonset_security_floor(built):
    for objects in built.values():
        ds = one(objects, "DaemonSet", "llmslo-exporter")
        spec = ds["spec"]["template"]["spec"]
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(key), key
        # No host folder: which pod holds which GPU comes from the podmap relay (test_podmap_relay_...).
        assert [v for v in spec.get("volumes", []) if "hostPath" in v] == []
        (container,) = spec["containers"]
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["privileged"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert "add" not in sc["capabilities"]
        assert DIGEST.match(container["image"]), container["image"]
        env = {e["name"]: e for e in container["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
        assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
        assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        res = container["resources"]
        assert set(res["requests"]) == {"cpu", "memory"} and set(res["limits"]) == {"cpu", "memory"}
        assert "nvidia.com/gpu" not in res["limits"]  # reads NVML without taking a GPU from the engines
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert ports["metrics"] == DEFAULT_PORT


def test_podmap_relay_is_the_one_host_folder_read_only_as_the_sockets_owner_without_capabilities(built, tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    for objects in built.values():
        ds = one(objects, "DaemonSet", "llmslo-podmap")
        assert ds["metadata"]["namespace"] == "llmslo-node"
        spec = ds["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsUser"] == 0 and spec["securityContext"]["seccompProfile"] == {
            "type": "RuntimeDefault"}
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(key), key
        (host,) = [v for v in spec["volumes"] if "hostPath" in v]
        assert host["hostPath"]["path"] == os.path.dirname(ExporterConfig().pod_resources_socket)
        (container,) = spec["containers"]
        (mount,) = container["volumeMounts"]
        assert mount == {"name": host["name"], "mountPath": host["hostPath"]["path"], "readOnly": True}
        assert container["args"][container["args"].index("--pod-resources-socket") + 1] == \
            ExporterConfig().pod_resources_socket
        sc = container["securityContext"]
        assert sc == {"privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
        assert DIGEST.match(container["image"]), container["image"]
        service = one(objects, "Service", "llmslo-podmap")
        assert service["spec"]["internalTrafficPolicy"] == "Local"
        # the exporter asks exactly that Service, on its port
        url = exporter_config(objects, tmp_path / "exporter.yaml").pod_resources_url
        port = service["spec"]["ports"][0]["port"]
        assert url == f"http://llmslo-podmap.llmslo-node.svc:{port}/v1/owners"


def exporter_config(objects: list[dict], path: Path) -> ExporterConfig:
    """The exporter's settings as the DaemonSet runs it: its ConfigMap's file, then its flags, read by
    the exporter's own parser and merge."""
    ds = one(objects, "DaemonSet", "llmslo-exporter")
    cm_name = ds["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    cm = one(objects, "ConfigMap", cm_name)  # kustomize's hashed name, referenced by the DaemonSet
    path.write_text(cm["data"]["exporter.yaml"])
    args = build_parser().parse_args(ds["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.config == "/etc/llmslo/exporter.yaml"
    return merge_cli(load_config(path, check=False), discovery_namespaces=args.discovery_namespaces)


def test_exporter_config_loads_with_the_exporters_own_loader(built, monkeypatch, tmp_path):
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    for name, objects in built.items():
        config = exporter_config(objects, tmp_path / f"{name}.yaml")
        assert config.listen.port == DEFAULT_PORT
        assert config.discovery.enabled and config.gpu == "nvml"


POD_READER = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
EXPORTER_SA = [{"kind": "ServiceAccount", "name": "llmslo-exporter", "namespace": "monitoring"}]  # llmslo.yaml


def test_rbac_reads_pods_where_discovery_looks_and_nothing_else(built, monkeypatch, tmp_path):
    """All namespaces: one ClusterRole. Named namespaces: a Role in each of them, in no other, and no
    cluster-wide grant (what the overlay's flag names and what it grants must not drift apart)."""
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    watched = {}
    for name, objects in built.items():
        namespaces = exporter_config(objects, tmp_path / f"{name}.yaml").discovery.namespaces
        watched[name] = namespaces
        if not namespaces:
            assert one(objects, "ClusterRole", "llmslo-exporter")["rules"] == POD_READER
            binding = one(objects, "ClusterRoleBinding", "llmslo-exporter")
            assert binding["subjects"] == EXPORTER_SA and binding["roleRef"]["kind"] == "ClusterRole"
            assert not find(objects, "Role") and not find(objects, "RoleBinding")
            continue
        assert not find(objects, "ClusterRole") and not find(objects, "ClusterRoleBinding"), name
        roles, bindings = find(objects, "Role"), find(objects, "RoleBinding")
        assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces), name
        assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(namespaces), name
        for role, binding in zip(roles, bindings, strict=True):
            assert role["rules"] == POD_READER
            assert binding["subjects"] == EXPORTER_SA
            assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert watched["dev"] == watched["production"] == ("llm",)


def test_network_policy_denies_by_default_and_lets_only_prometheus_scrape(built):
    for objects in built.values():
        policies = [p for p in find(objects, "NetworkPolicy") if p["metadata"]["namespace"] == "monitoring"]
        deny = next(p for p in policies if p["metadata"]["name"] == "default-deny-all")
        assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
        exporter = next(p for p in policies if p["metadata"]["name"] == "llmslo-exporter")
        (ingress,) = exporter["spec"]["ingress"]
        (source,) = ingress["from"]
        assert source["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
        assert ingress["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        engines, api, podmap, dns = exporter["spec"]["egress"]
        selector = engines["to"][0]["podSelector"]["matchExpressions"][0]
        assert selector == {"key": KubernetesDiscovery().engine_label, "operator": "Exists"}
        assert {p["port"] for p in api["ports"]} == {443, 6443}
        relay = one(objects, "DaemonSet", "llmslo-podmap")
        assert podmap["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "llmslo-node"}},
                                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "llmslo-podmap"}}}]
        assert podmap["to"][0]["podSelector"]["matchLabels"].items() <= \
            relay["spec"]["template"]["metadata"]["labels"].items()
        assert [p["port"] for p in podmap["ports"]] == [relay["spec"]["template"]["spec"]["containers"][0]["ports"][0][
            "containerPort"]]
        assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
        # the relay's namespace: nothing in, but the exporter to the relay's port; nothing out
        relay_policies = {p["metadata"]["name"]: p for p in find(objects, "NetworkPolicy")
                          if p["metadata"]["namespace"] == "llmslo-node"}
        assert relay_policies["default-deny-all"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
        (allowed,) = relay_policies["llmslo-podmap"]["spec"]["ingress"]
        assert allowed["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "llmslo-exporter"}}
    for objects in built.values():
        policy = one(objects, "NetworkPolicy", "llmslo-exporter")
        assert policy["spec"]["egress"][1]["to"][0]["ipBlock"]["cidr"] == "10.0.0.0/16"  # llmslo.yaml
        # Engines only in the inference namespaces, by name (their Namespaces need no label of ours), the ones
        # discovery watches (test_install.py checks the two agree, for any names)
        assert policy["spec"]["egress"][0]["to"][0]["namespaceSelector"] == {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["llm"]}]}


def test_pod_monitor_scrapes_the_exporter_and_keeps_its_labels(built):
    for objects in built.values():
        pm = one(objects, "PodMonitor", "llmslo-exporter")
        ds = one(objects, "DaemonSet", "llmslo-exporter")
        assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
        (endpoint,) = pm["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True


def test_every_image_is_pinned_by_digest(built):
    for name, objects in built.items():
        for where, spec in pod_specs(objects):
            for container in spec["containers"] + spec.get("initContainers", []):
                assert DIGEST.match(container["image"]), (name, where, container["image"])


def test_generated_rules_and_autoscalers_are_included(built):
    for name, objects in built.items():
        assert find(objects, "PrometheusRule"), name
        assert find(objects, "ScaledObject"), name
        # The HPA alternative (deploy/generated/hpa) is applied instead of KEDA, never next to it.
        assert not find(objects, "HorizontalPodAutoscaler"), name


def _tap_args(container: dict) -> argparse.Namespace:
    from exporter.tap.cli import add_parser

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    add_parser(sub)
    return parser.parse_args(container["args"])


def test_tap_sidecar_example_is_wired_to_the_engine_and_the_exporter(built):
    objects = built["dev"]
    deployment = one(objects, "Deployment", "vllm-llama-3-8b")
    pod = deployment["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    args = _tap_args(containers["tap"])  # the tap's real argument parser accepts them
    ports = {p["name"]: p["containerPort"] for c in containers.values() for p in c["ports"]}
    assert args.listen[1] == ports["tap"]
    vllm_args = containers["vllm"]["args"]
    vllm_port = int(vllm_args[vllm_args.index("--port") + 1])
    assert args.upstream == f"http://127.0.0.1:{vllm_port}"
    d = KubernetesDiscovery()
    annotations = pod["metadata"]["annotations"]
    assert pod["metadata"]["labels"][d.engine_label] == "vllm"
    assert int(annotations[d.port_annotation]) == vllm_port
    assert int(annotations[d.tap_port_annotation]) == args.metrics_listen[1]
    service = one(objects, "Service", "vllm-llama-3-8b")
    assert service["spec"]["ports"][0]["targetPort"] == "tap"  # clients go through the tap
    # The exporter may reach both metrics ports, through both NetworkPolicies.
    exporter_egress = {p["port"] for p in one(objects, "NetworkPolicy", "llmslo-exporter")["spec"]["egress"][0]["ports"]}
    assert {vllm_port, args.metrics_listen[1]} <= exporter_egress
    # The SLO classes the tap reads are the generated ConfigMap.
    slos_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "slos")
    assert find(objects, "ConfigMap", slos_volume["configMap"]["name"])


def test_example_inference_pod_meets_the_security_floor(built):
    """The floor's four rules, checked on the example the policy must admit."""
    objects = built["dev"]
    pod = one(objects, "Deployment", "vllm-llama-3-8b")["spec"]["template"]["spec"]
    namespace = one(objects, "Namespace", "llm")
    binding = one(objects, "ValidatingAdmissionPolicyBinding", "llmslo-inference-security-floor")
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"].items() <= \
        namespace["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == "llm-inference" and pod["runtimeClassName"] == "nvidia"
    persistent = {v["name"] for v in pod["volumes"] if {"persistentVolumeClaim", "hostPath", "csi", "image"} & set(v)}
    assert persistent == {"weights"}
    for c in pod["containers"]:
        assert DIGEST.match(c["image"])
        for m in c.get("volumeMounts", []):
            if m["name"] in persistent:
                assert m.get("readOnly") is True


def test_security_floor_policy_is_enforced_in_production_and_audited_in_dev(built):
    prod = one(built["production"], "ValidatingAdmissionPolicyBinding", "llmslo-inference-security-floor")
    dev = one(built["dev"], "ValidatingAdmissionPolicyBinding", "llmslo-inference-security-floor")
    assert prod["spec"]["validationActions"] == ["Deny"]
    assert dev["spec"]["validationActions"] == ["Warn", "Audit"]
    policy = one(built["production"], "ValidatingAdmissionPolicy", "llmslo-inference-security-floor")
    text = "\n".join(" ".join(v["expression"].split())
                     for v in policy["spec"]["validations"] + policy["spec"]["variables"])
    for needle in ("llm-inference", "runtimeClassName == 'nvidia'", "readOnly", "@sha256:[0-9a-f]{64}"):
        assert needle in text, needle
    assert policy["spec"]["failurePolicy"] == "Fail"


def test_dockerfile_runs_the_exporter_as_a_non_root_user():
    text = (DEPLOY / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0", "0:0")
    assert users[-1].split(":")[0].isdigit()  # numeric, so runAsNonRoot can verify it
    assert re.search(r'^ENTRYPOINT \["llmslo-exporter"\]', text, re.MULTILINE)
    daemonset = yaml.safe_load((ROOT / "slogen" / "kustomize" / "base" / "daemonset.yaml").read_text())
    assert int(users[-1].split(":")[0]) == daemonset["spec"]["template"]["spec"]["securityContext"]["runAsUser"]


def test_every_deployed_alert_has_a_runbook_in_the_repository(built):
    from slogen.rules.alerts import runbook_path

    rules = find(built["production"], "PrometheusRule")
    alerts = [r for obj in rules for g in obj["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert len({a["alert"] for a in alerts}) >= 10
    for alert in alerts:
        path = runbook_path(alert["alert"])
        assert alert["annotations"]["runbook_url"].endswith("/" + path), alert["alert"]
        text = (ROOT / path).read_text()
        assert text.startswith(f"# {alert['alert']}\n")


def test_prometheus_rules_land_where_prometheus_looks(built):
    for objects in built.values():
        rules = find(objects, "PrometheusRule")
        assert rules and {r["metadata"]["namespace"] for r in rules} == {"monitoring"}
