"""The injector's manifests (slogen/kustomize/tap-injector) as kustomize renders them: core objects valid against
Kubernetes' schemas (kubernetes-validate, strict), the webhook configuration that can never block a rollout, the
selectors that send each pod to the right webhook (or none), the certificate wiring, the floor, and the
documented way without cert-manager.

The cert-manager Issuer and Certificate were checked once against cert-manager's own CRDs (deploy/crds at
cert-manager/cert-manager 2d0d7f7, 2026-08-22, unknown fields refused: no error); ../shared has no cert-manager
schema to check them on every run, so the fields are asserted here."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from exporter.tap_inject import cli, server
from exporter.tap_inject import pod as P
from slogen.podsecurity import check_manifests
from tests.helpers.needs import command

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "slogen" / "kustomize" / "tap-injector"
NAMESPACE = "llmslo-tap-injector"
K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
DIGEST = "sha256:" + "cd" * 32


def kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = command("kubectl", "install kubectl: its built-in kustomize renders the manifests")
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return kustomize(BASE)


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def test_core_objects_are_valid_on_the_oldest_and_newest_kubernetes(objects):
    core = [o for o in objects if not o["apiVersion"].startswith(("cert-manager.io/", "monitoring.coreos.com/"))]
    assert {o["kind"] for o in core} == {"Namespace", "ServiceAccount", "Deployment", "Service", "PodDisruptionBudget",
                                         "NetworkPolicy", "MutatingWebhookConfiguration"}
    for obj in core:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_webhooks_can_never_block_a_rollout(objects):
    config = one(objects, "MutatingWebhookConfiguration")
    assert len(config["webhooks"]) == 2
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Ignore"  # the injector down: every pod admitted unchanged
        assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
        assert hook["reinvocationPolicy"] == "Never" and 1 <= hook["timeoutSeconds"] <= 5
        assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                  "resources": ["pods"], "scope": "Namespaced"}]


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector as the API server evaluates it (matchLabels and matchExpressions, ANDed)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if ((op == "In" and labels.get(key) not in values) or (op == "NotIn" and key in labels and labels[key] in values)
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels)):
            return False
    return True


def _called(config: dict[str, Any], namespace: dict[str, str], pod: dict[str, str]) -> list[str]:
    return [h["clientConfig"]["service"]["path"] for h in config["webhooks"]
            if _matches(h["namespaceSelector"], namespace) and _matches(h["objectSelector"], pod)]


@pytest.mark.parametrize(("namespace", "pod", "paths"), [
    ({}, {P.LABEL_TAP: P.ENABLED}, [server.PATH_POD]),
    ({}, {}, []),
    ({}, {P.LABEL_TAP: P.DISABLED}, []),
    ({P.NAMESPACE_LABEL: P.ENABLED}, {}, [server.PATH_NAMESPACE]),
    ({P.NAMESPACE_LABEL: P.ENABLED}, {P.LABEL_TAP: P.ENABLED}, [server.PATH_POD]),  # once, not twice
    ({P.NAMESPACE_LABEL: P.ENABLED}, {P.LABEL_TAP: P.DISABLED}, []),
    ({P.NAMESPACE_LABEL: "yes"}, {}, []),
])
def test_each_pod_reaches_the_webhook_its_opt_in_names(objects, namespace, pod, paths):
    config = one(objects, "MutatingWebhookConfiguration")
    assert _called(config, {"kubernetes.io/metadata.name": "llm", **namespace}, pod) == paths
    for skipped in ("kube-system", NAMESPACE):  # never: the injector must not wait on itself
        assert _called(config, {"kubernetes.io/metadata.name": skipped, **namespace}, pod) == []


def test_the_webhooks_reach_the_service_and_trust_the_certificates_ca(objects):
    config = one(objects, "MutatingWebhookConfiguration")
    service, cert = one(objects, "Service"), one(objects, "Certificate")
    for hook in config["webhooks"]:
        ref = hook["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"]) == (service["metadata"]["name"], service["metadata"]["namespace"])
        assert ref["port"] in [p["port"] for p in service["spec"]["ports"]]
        assert ref["path"] in server.ROUTES
    ns, name = cert["metadata"]["namespace"], cert["metadata"]["name"]
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{ns}/{name}"
    assert f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc" in cert["spec"]["dnsNames"]
    issuer = one(objects, "Issuer")
    assert cert["spec"]["issuerRef"] == {"name": issuer["metadata"]["name"], "kind": "Issuer", "group": "cert-manager.io"}
    assert issuer["spec"] == {"selfSigned": {}} and issuer["metadata"]["namespace"] == ns
    assert "server auth" in cert["spec"]["usages"]
    deployment = one(objects, "Deployment")
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["secretName"] == cert["spec"]["secretName"]


def _injector(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], argparse.Namespace]:
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "tap-injector"
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    args = cli.build_parser().parse_args(container["args"][1:] + ["--tap-image", env[cli.TAP_IMAGE_ENV]])
    return container, args


def test_the_deployment_runs_the_injectors_own_flags_on_the_ports_the_service_names(objects):
    container, args = _injector(objects)
    mount = container["volumeMounts"][0]
    assert mount["readOnly"] and Path(args.tls_cert_file).parent == Path(args.tls_key_file).parent == Path(
        mount["mountPath"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.listen[1] == ports["webhook"] and args.metrics_listen.endswith(f":{ports['metrics']}")
    assert one(objects, "Service")["spec"]["ports"][0]["targetPort"] == "webhook"
    assert args.slo_configmap == "llmslo-slos"
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_the_install_image_reaches_the_injector_and_the_tap_it_injects(tmp_path):
    """An `images` entry above the base (as the install writes one) sets both: the container and LLMSLO_TAP_IMAGE."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(BASE, tmp_path)],  # kustomize wants it relative
        "images": [{"name": "ghcr.io/llmslo/llmslo", "newName": "registry.example/llmslo", "digest": DIGEST}]}))
    container, args = _injector(kustomize(tmp_path))
    assert container["image"] == args.tap_image == f"registry.example/llmslo@{DIGEST}"
    assert cli.settings_from(args).problems() == []
    # As shipped (the placeholder), the injector refuses to start rather than inject an image no registry has.
    _, shipped = _injector(kustomize(BASE))
    assert any("--tap-image" in p for p in cli.settings_from(shipped).problems())


def test_the_injector_meets_restricted_in_its_namespace(objects):
    namespace = one(objects, "Namespace")
    assert namespace["metadata"]["name"] == NAMESPACE
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert check_manifests(objects) == []
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["serviceAccountName"] == "llmslo-tap-injector"
    assert not [o for o in objects if o["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    sc = spec["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]}
    assert re.fullmatch(r"\S+@sha256:[0-9a-f]{64}", spec["containers"][0]["image"])


def test_the_network_policy_denies_by_default_and_admits_the_webhook_port(objects):
    deny = one(objects, "NetworkPolicy", "default-deny-all")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    policy = one(objects, "NetworkPolicy", "llmslo-tap-injector")
    webhook, metrics = policy["spec"]["ingress"]
    assert webhook == {"ports": [{"port": "webhook", "protocol": "TCP"}]}  # the API server is no pod: any source
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


def _documented_overlay() -> str:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    after = doc.split("<!-- tap-injector-without-cert-manager", 1)[1]
    return after.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_documented_way_without_cert_manager_renders_with_the_ca_given(tmp_path):
    text = _documented_overlay().replace("install/bases/tap-injector", os.path.relpath(BASE, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(text.replace("<base64 of ca.crt>", "Q0E="))
    rendered = kustomize(tmp_path)
    assert not [o for o in rendered if o["apiVersion"].startswith("cert-manager.io/")]
    config = one(rendered, "MutatingWebhookConfiguration")
    assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})
    assert [h["clientConfig"]["caBundle"] for h in config["webhooks"]] == ["Q0E=", "Q0E="]
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(config, version, strict=True)


def _load_vap():
    """tests/deploy/vap.py, the floor's CEL evaluator (loaded by path: tests are imported with importlib)."""
    import importlib.util
    import sys

    name = "llmslo_tests_vap"  # the name tests/deploy loads it under: one module object
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "deploy" / "vap.py")
        assert spec and spec.loader
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def test_an_injected_pod_is_admitted_by_the_inference_security_floor(make_pod, make_review, settings):
    """The floor (ValidatingAdmissionPolicy, Deny) runs after the mutating webhooks: it judges the injected pod."""
    import base64
    import json

    import jsonpatch

    from exporter.tap_inject import review

    vap = _load_vap()
    rendered = kustomize(ROOT / "slogen" / "kustomize" / "policy")
    floor = vap.Policy(one(rendered, "ValidatingAdmissionPolicy", "llmslo-inference-security-floor"),
                       one(rendered, "ValidatingAdmissionPolicyBinding", "llmslo-inference-security-floor"))
    namespace = {"kubernetes.io/metadata.name": "llm", "llmslo.io/inference": "true"}

    def injected(tap_image: str) -> dict[str, Any]:
        req = make_review(make_pod({P.LABEL_TAP: P.ENABLED}))
        answer = review.answer(json.dumps(req).encode(), False, P.InjectorSettings(tap_image=tap_image))
        ops = json.loads(base64.b64decode(json.loads(answer.body)["response"]["patch"]))
        return jsonpatch.apply_patch(req["request"]["object"], ops)

    decision = floor.admit(vap.Request("CREATE", injected(settings.tap_image), namespace))
    assert decision.applied and decision.allowed, decision.messages
    # Teeth: the same pod with the tap's image by tag (which the injector's settings refuse) is denied.
    decision = floor.admit(vap.Request("CREATE", injected("ghcr.io/llmslo/llmslo:latest"), namespace))
    assert not decision.allowed and any("digest" in m for m in decision.messages), decision.messages
