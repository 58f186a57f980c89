"""The pool kept apart at admission (issue #38, part 3): the serving identity and the pool's egress.

The floor's CEL is executed (tests/deploy/vap.py, cel-expr-python) on the objects the overlays render: a
serving pod with a training job's service account, and NetworkPolicies in the serving namespace that would
let its pods out (0.0.0.0/0, every namespace, a rule without peers), beside the example pool's own policies,
which must pass. Audit (dev) reports and admits; enforce (production) refuses the same objects.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest

from tests.deploy.conftest import vap

INFERENCE_NS = {"kubernetes.io/metadata.name": "llm", "llmslo.io/inference": "true"}
EGRESS = "llmslo-inference-egress-floor"
PODS = "llmslo-inference-security-floor"


def _one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _policy(objects: list[dict], name: str):
    return vap.Policy(_one(objects, "ValidatingAdmissionPolicy", name),
                      _one(objects, "ValidatingAdmissionPolicyBinding", name))


def netpol_request(policy: dict, operation: str = "CREATE", old: dict | None = None,
                   labels: dict | None = None) -> Any:
    return vap.Request(operation, policy, INFERENCE_NS if labels is None else labels, old_object=old,
                       resource="networkpolicies", group="networking.k8s.io", kind="NetworkPolicy")


def egress_policy(*rules: dict, name: str = "extra") -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": "llm"},
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "vllm-llama-3-8b"}},
                     "policyTypes": ["Egress"], "egress": list(rules)}}


def ns_peer(name: str | None, **extra: Any) -> dict:
    selector: dict = {"matchLabels": {"kubernetes.io/metadata.name": name}} if name else {}
    return {"namespaceSelector": {**selector, **extra}}


DNS_PORTS = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
OPEN = "an egress rule without `to` allows every destination"
IPBLOCK = "egress to an ipBlock leaves the serving pool: "
OTHER_NS = "egress to other namespaces leaves the serving pool"


@dataclass(frozen=True)
class Case:
    name: str
    rules: tuple[dict, ...]
    messages: tuple[str, ...] = ()  # one substring per failed validation, in order; () = admitted


CASES = [
    Case("pods of the namespace by podSelector", ({"to": [{"podSelector": {"matchLabels": {"role": "decode"}}}]},)),
    Case("the namespace by name", ({"to": [ns_peer("llm")], "ports": [{"port": 5557}]},)),
    Case("the namespace by name, narrowed", ({"to": [ns_peer("llm", matchExpressions=[
        {"key": "team", "operator": "In", "values": ["a"]}])]},)),
    Case("DNS in kube-system", ({"to": [{**ns_peer("kube-system"), "podSelector": {"matchLabels": {
        "k8s-app": "kube-dns"}}}], "ports": DNS_PORTS},)),
    Case("0.0.0.0/0", ({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]},), (IPBLOCK + "0.0.0.0/0",)),
    Case("::/0 and a private range", ({"to": [{"ipBlock": {"cidr": "::/0"}}]},
                                      {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                                       "ports": [{"port": 443}]}), (IPBLOCK + "::/0, 10.0.0.0/8",)),
    Case("a rule with ports only", ({"ports": [{"port": 443}]},), (OPEN,)),
    Case("a rule allowing everything", ({},), (OPEN,)),
    Case("an empty peer list", ({"to": []},), (OPEN,)),
    Case("every namespace", ({"to": [ns_peer(None)]},), (OTHER_NS,)),
    Case("namespaces by another label", ({"to": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]},),
         (OTHER_NS,)),
    Case("namespaces by expression only", ({"to": [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["prod"]}]}}]},), (OTHER_NS,)),
    Case("the training namespace", ({"to": [ns_peer("training")]},), (OTHER_NS + "; allowed are this namespace "
                                                                      "(namespaceSelector matchLabels "
                                                                      "kubernetes.io/metadata.name: llm)",)),
    Case("kube-system beyond DNS", ({"to": [ns_peer("kube-system")], "ports": [{"port": 443}]},), (OTHER_NS,)),
    Case("kube-system on every port", ({"to": [ns_peer("kube-system")]},), (OTHER_NS,)),
    Case("kube-system on a port range from 53", ({"to": [ns_peer("kube-system")],
                                                  "ports": [{"port": 53, "endPort": 65535}]},), (OTHER_NS,)),
    Case("kube-system by a named port", ({"to": [ns_peer("kube-system")], "ports": [{"port": "dns"}]},), (OTHER_NS,)),
    Case("every fault at once", ({"ports": [{"port": 80}]}, {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, ns_peer(None)]}),
         (OPEN, IPBLOCK + "0.0.0.0/0", OTHER_NS)),
]


@pytest.fixture(scope="module")
def egress(built) -> dict[str, Any]:
    return {name: _policy(objects, EGRESS) for name, objects in built.items()}


@pytest.fixture(scope="module")
def pods(built) -> dict[str, Any]:
    return {name: _policy(objects, PODS) for name, objects in built.items()}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_egress_matrix(egress, case: Case):
    policy = egress_policy(*case.rules)
    decision = egress["production"].admit(netpol_request(policy))
    assert decision.applied
    assert decision.allowed is (not case.messages), decision.messages
    assert len(decision.messages) == len(case.messages), decision.messages
    for want, got in zip(case.messages, decision.messages, strict=True):
        assert want in got and "NetworkPolicy extra in serving namespace llm" in got, (want, got)
    assert decision.reasons == ["Forbidden"] * len(case.messages)


def test_the_example_pools_policies_are_admitted(built, egress):
    """The seed's default-deny and its ingress policy, as the dev overlay renders them, pass both overlays."""
    seed = [o for o in built["dev"] if o["kind"] == "NetworkPolicy" and o["metadata"].get("namespace") == "llm"]
    assert {o["metadata"]["name"] for o in seed} == {"default-deny-all", "vllm-llama-3-8b"}
    deny = _one(seed, "NetworkPolicy", "default-deny-all")
    assert deny["spec"]["podSelector"] == {} and "Egress" in deny["spec"]["policyTypes"]
    assert not deny["spec"].get("egress")
    for overlay, policy in egress.items():
        for obj in seed:
            decision = policy.admit(netpol_request(obj))
            assert decision.applied and decision.allowed, (overlay, obj["metadata"]["name"], decision.messages)


def test_opening_the_default_deny_on_update_is_refused(built, egress):
    deny = _one([o for o in built["dev"] if o["metadata"].get("namespace") == "llm"], "NetworkPolicy",
                "default-deny-all")
    opened = copy.deepcopy(deny)
    opened["spec"]["egress"] = [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]
    decision = egress["production"].admit(netpol_request(opened, "UPDATE", old=deny))
    assert not decision.allowed and decision.messages == [
        "NetworkPolicy default-deny-all in serving namespace llm: egress to an ipBlock leaves the serving pool: 0.0.0.0/0"]


def test_audit_reports_and_admits_enforce_refuses(egress):
    """The install's choice decides: dev (floor audit) warns and audits, production (enforce) denies."""
    request = netpol_request(egress_policy({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}))
    audit = vap.respond(egress["dev"], request)
    assert audit.admitted and len(audit.warnings) == 1 and "0.0.0.0/0" in audit.warnings[0]
    assert audit.audited == audit.warnings
    enforce = vap.respond(egress["production"], request)
    assert not enforce.admitted and enforce.warnings == []


def test_only_the_serving_namespaces_policies_are_judged(egress):
    wide = egress_policy({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]})
    decision = egress["production"].admit(netpol_request(wide, labels={"kubernetes.io/metadata.name": "training"}))
    assert decision.allowed and not decision.applied


def test_each_floor_matches_its_own_kind(egress, pods):
    """A NetworkPolicy is not judged by the pods' rules, nor a pod by the egress rules (by API group too)."""
    netpol = netpol_request(egress_policy({}))
    assert egress["production"].matches(netpol) and not pods["production"].matches(netpol)
    pod = vap.Request("CREATE", {"spec": {}}, INFERENCE_NS)
    assert pods["production"].matches(pod) and not egress["production"].matches(pod)
    same_name_other_group = vap.Request("CREATE", egress_policy({}), INFERENCE_NS, resource="networkpolicies",
                                        group="crd.projectcalico.org", kind="NetworkPolicy")
    assert not egress["production"].matches(same_name_other_group)


# ---- the serving identity --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def serving_pod(built) -> dict:
    template = _one(built["dev"], "Deployment", "vllm-llama-3-8b")["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vllm-0", **copy.deepcopy(template["metadata"])},
            "spec": copy.deepcopy(template["spec"])}


def test_a_serving_pod_as_the_serving_account_is_admitted(built, pods, serving_pod):
    assert _one(built["dev"], "ServiceAccount", "llm-inference")["automountServiceAccountToken"] is False
    for overlay, policy in pods.items():
        decision = policy.admit(vap.Request("CREATE", serving_pod, INFERENCE_NS))
        assert decision.applied and decision.allowed, (overlay, decision.messages)


@pytest.mark.parametrize("account", ["trainer", "llm-training", "jupyter", "default"])
def test_a_serving_pod_as_a_training_account_is_reported_or_refused(pods, serving_pod, account: str):
    pod = copy.deepcopy(serving_pod)
    pod["spec"]["serviceAccountName"] = account
    request = vap.Request("CREATE", pod, INFERENCE_NS)
    want = f"inference pods must run as service account llm-inference, not {account} (the one serving identity"
    audit = vap.respond(pods["dev"], request)
    assert audit.admitted and len(audit.warnings) == 1 and want in audit.warnings[0], audit.warnings
    assert audit.audited == audit.warnings
    enforce = vap.respond(pods["production"], request)
    assert not enforce.admitted and enforce.warnings == [] and len(enforce.audited) == 0
    assert want in pods["production"].admit(request).messages[0]
