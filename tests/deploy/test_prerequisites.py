"""What each overlay needs to exist in the cluster: shipped, or named as a parameter or prerequisite.

A kube-apiserver 1.36 accepted every object but refused what pointed elsewhere: namespaces the
production overlay did not create, and pods naming a RuntimeClass nobody had registered.
"""

from __future__ import annotations

from pathlib import Path

from slogen import settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "RuntimeClass", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding", "ClusterImagePolicy"}


def monitoring_namespace() -> str:
    """The repository's install settings (llmslo.yaml): where the exporter, rules and routing go."""
    return settings.load(ROOT / "llmslo.yaml").namespace


def test_every_namespace_used_is_shipped_or_a_parameter(built):
    for name, objects in built.items():
        shipped = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
        used = {o["metadata"]["namespace"] for o in objects if o["kind"] not in CLUSTER_SCOPED}
        assert all(o["kind"] in CLUSTER_SCOPED or o["metadata"].get("namespace") for o in objects), name
        # the monitoring namespace belongs to the Prometheus stack: used, never shipped (deleting the install
        # must not delete it)
        assert used - shipped == {monitoring_namespace()}, (name, used - shipped)
        assert shipped == {"llm", "llmslo-node"}  # llmslo-node: the podmap relay's own (slogen/kustomize/podmap)


def test_the_monitoring_namespace_parameter_reaches_every_use(built):
    for _name, objects in built.items():
        monitoring = monitoring_namespace()
        rules = [o for o in objects if o["kind"] == "PrometheusRule"]
        assert rules and {r["metadata"]["namespace"] for r in rules} == {monitoring}
        policy = next(o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "llmslo-exporter")
        (source,) = policy["spec"]["ingress"][0]["from"]
        assert source["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": monitoring}
        relay = next(o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "llmslo-podmap")
        assert relay["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": monitoring}


def test_the_inference_namespace_carries_the_labels_the_policies_select(built):
    for name, objects in built.items():
        ns = next(o for o in objects if o["kind"] == "Namespace" and o["metadata"]["name"] == "llm")
        binding = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"
                       and o["metadata"]["name"] == "llmslo-inference-security-floor")
        assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"].items() <= \
            ns["metadata"]["labels"].items()
        assert ns["metadata"]["labels"]["policy.sigstore.dev/include"] == "true"
        labels = ns["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "restricted"
        # dev's floor audits; production's enforces
        assert labels.get("pod-security.kubernetes.io/enforce") == ("restricted" if name == "production" else None)
        # Where the generated autoscalers live: this namespace.
        assert {o["metadata"]["namespace"] for o in objects if o["kind"] == "ScaledObject"} == {"llm"}
        # It holds your engines: GitOps tools must not prune it with the overlay.
        assert ns["metadata"]["annotations"]["argocd.argoproj.io/sync-options"] == "Delete=false"
        assert ns["metadata"]["annotations"]["kustomize.toolkit.fluxcd.io/prune"] == "disabled"


def _runtime_classes_used(objects: list[dict]) -> set[str]:
    return {o["spec"]["template"]["spec"]["runtimeClassName"] for o in objects
            if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
            and "runtimeClassName" in o["spec"]["template"]["spec"]}


def test_runtime_class_nvidia_is_shipped_in_dev_and_a_documented_prerequisite_in_production(built):
    dev = built["dev"]
    classes = {o["metadata"]["name"]: o for o in dev if o["kind"] == "RuntimeClass"}
    assert _runtime_classes_used(dev) == {"nvidia"} <= set(classes)
    assert classes["nvidia"]["handler"] == "nvidia"
    # The RuntimeClass schedules onto GPU nodes, as the exporter DaemonSet does.
    ds = next(o for o in dev if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert classes["nvidia"]["scheduling"]["nodeSelector"] == ds["nodeSelector"]
    production = built["production"]
    assert _runtime_classes_used(production) == {"nvidia"}
    assert not [o for o in production if o["kind"] == "RuntimeClass"]  # the GPU operator owns it there
    docs = (ROOT / "docs" / "deploy.md").read_text()
    start = docs.index("Requirements")
    prerequisites = docs[start:docs.index("\n## ", start)]
    assert "`nvidia` RuntimeClass" in prerequisites and "the namespace your Prometheus" in prerequisites
