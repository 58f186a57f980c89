"""The inference security floor's CEL, executed (tests/deploy/vap.py) on a matrix of pods.

Every pod starts as the example inference pod the dev overlay renders (which must pass), then
breaks one rule, or several, or comes in as `kubectl debug` would add an ephemeral container.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest


def _vap():
    name = "llmslo_tests_vap"  # the same module object the conftest loaded
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("vap.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


vap = _vap()
DIGEST = "@sha256:" + "ab" * 32
INFERENCE_NS = {"kubernetes.io/metadata.name": "llm", "llmslo.io/inference": "true"}


def _one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


@pytest.fixture(scope="module")
def policies(built) -> dict[str, Any]:
    """Overlay -> its rendered policy and binding, compiled."""
    return {name: vap.Policy(_one(objects, "ValidatingAdmissionPolicy", "llmslo-inference-security-floor"),
                             _one(objects, "ValidatingAdmissionPolicyBinding", "llmslo-inference-security-floor"))
            for name, objects in built.items()}


@pytest.fixture(scope="module")
def example_pod(built) -> dict:
    template = _one(built["dev"], "Deployment", "vllm-llama-3-8b")["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "vllm-llama-3-8b-0", "namespace": "llm", **copy.deepcopy(template["metadata"])},
            "spec": copy.deepcopy(template["spec"])}


def container(pod: dict, name: str) -> dict:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def mount(pod: dict, container_name: str, volume: str) -> dict:
    return next(m for m in container(pod, container_name)["volumeMounts"] if m["name"] == volume)


def debug_container(image: str, mounts: list[dict] | None = None) -> dict:
    """What `kubectl debug -it <pod> --image=<image>` adds to spec.ephemeralContainers."""
    c = {"name": "debugger-x7k2p", "image": image, "stdin": True, "tty": True,
         "targetContainerName": "vllm", "terminationMessagePolicy": "File"}
    if mounts:
        c["volumeMounts"] = mounts
    return c


@dataclass(frozen=True)
class Case:
    name: str
    change: Callable[[dict], None]
    allowed: bool
    messages: tuple[str, ...] = ()  # substrings, one per expected denial, in validation order
    operation: str = "CREATE"
    sub_resource: str = ""
    # UPDATE: the pod before the change is the unchanged example, or `before` applied to it.
    before: Callable[[dict], None] | None = None


def _set(path: list, value) -> Callable[[dict], None]:
    def change(pod: dict) -> None:
        node = pod
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


def _del(path: list) -> Callable[[dict], None]:
    def change(pod: dict) -> None:
        node = pod
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return change


def _all(*changes: Callable[[dict], None]) -> Callable[[dict], None]:
    def change(pod: dict) -> None:
        for c in changes:
            c(pod)
    return change


def _writable_weights(pod: dict) -> None:
    del mount(pod, "vllm", "weights")["readOnly"]


def _tagged_tap(pod: dict) -> None:
    container(pod, "tap")["image"] = "ghcr.io/llmslo/llmslo:v0.1.0"


def _init(image: str, mounts: list[dict] | None = None) -> Callable[[dict], None]:
    def change(pod: dict) -> None:
        c = {"name": "fetch-tokenizer", "image": image}
        if mounts:
            c["volumeMounts"] = mounts
        pod["spec"].setdefault("initContainers", []).append(c)
    return change


def _volume(volume: dict, container_name: str = "vllm", read_only: bool | None = None) -> Callable[[dict], None]:
    def change(pod: dict) -> None:
        pod["spec"]["volumes"].append(volume)
        m = {"name": volume["name"], "mountPath": "/extra"}
        if read_only is not None:
            m["readOnly"] = read_only
        container(pod, container_name)["volumeMounts"].append(m)
    return change


def _debug(image: str, mounts: list[dict] | None = None) -> Callable[[dict], None]:
    def change(pod: dict) -> None:
        pod["spec"].setdefault("ephemeralContainers", []).append(debug_container(image, mounts))
    return change


SA = "service account llm-inference"
RUNTIME = "runtimeClassName: nvidia"
RO = "must be mounted readOnly: true; not so in: "
PIN = "images must be pinned by digest"

CASES = [
    Case("compliant example pod", lambda pod: None, True),
    Case("image with a tag and a digest", _set(["spec", "containers", 0, "image"], f"ghcr.io/llmslo/llmslo:v1{DIGEST}"),
         True),
    Case("writable emptyDir scratch space", _volume({"name": "scratch", "emptyDir": {}}, read_only=False), True),
    Case("no service account", _del(["spec", "serviceAccountName"]), False, (f"{SA}, not default",)),
    Case("another service account", _set(["spec", "serviceAccountName"], "engine-admin"), False,
         (f"{SA}, not engine-admin",)),
    Case("no runtime class", _del(["spec", "runtimeClassName"]), False, (RUNTIME,)),
    Case("runc runtime class", _set(["spec", "runtimeClassName"], "runc"), False, (RUNTIME,)),
    Case("weights mounted without readOnly", _writable_weights, False, (RO + "vllm",)),
    Case("weights mounted readOnly: false", lambda pod: mount(pod, "vllm", "weights").update(readOnly=False), False,
         (RO + "vllm",)),
    Case("writable hostPath", _volume({"name": "host", "hostPath": {"path": "/models"}}, read_only=False), False,
         (RO + "vllm",)),
    Case("writable CSI volume", _volume({"name": "csi", "csi": {"driver": "s3.csi.aws.com"}}, "tap"), False,
         (RO + "tap",)),
    Case("writable image volume", _volume({"name": "oci", "image": {"reference": "weights" + DIGEST}}), False,
         (RO + "vllm",)),
    Case("read-only extra PVC", _volume({"name": "pvc2", "persistentVolumeClaim": {"claimName": "w2"}},
                                        read_only=True), True),
    Case("container image by tag", _tagged_tap, False, (PIN + " (name@sha256:<64 hex>): ghcr.io/llmslo/llmslo:v0.1.0",)),
    Case("uppercase digest", _set(["spec", "containers", 1, "image"], "vllm/vllm-openai@sha256:" + "AB" * 32), False,
         ("vllm/vllm-openai@sha256:ABAB",)),
    Case("short digest", _set(["spec", "containers", 1, "image"], "vllm/vllm-openai@sha256:abc"), False,
         ("vllm/vllm-openai@sha256:abc",)),
    Case("init container by tag", _init("busybox:1.36"), False, (f"{PIN} (name@sha256:<64 hex>): busybox:1.36",)),
    Case("init container writing the weights", _init("busybox" + DIGEST, [{"name": "weights", "mountPath": "/m"}]),
         False, (RO + "fetch-tokenizer",)),
    Case("pinned init container", _init("busybox" + DIGEST, [{"name": "weights", "mountPath": "/m", "readOnly": True}]),
         True),
    Case("kubectl debug busybox:latest", _debug("busybox:latest"), False, (f"{PIN} (name@sha256:<64 hex>): busybox:latest",),
         operation="UPDATE", sub_resource="ephemeralcontainers"),
    Case("kubectl debug, pinned image", _debug("busybox" + DIGEST), True,
         operation="UPDATE", sub_resource="ephemeralcontainers"),
    Case("kubectl debug writing the weights", _debug("busybox" + DIGEST, [{"name": "weights", "mountPath": "/m"}]),
         False, (RO + "debugger-x7k2p",), operation="UPDATE", sub_resource="ephemeralcontainers"),
    Case("image changed to a tag on UPDATE", _tagged_tap, False, (PIN,), operation="UPDATE"),
    # A pod admitted before the floor (a tag) whose labels change: not re-judged, so its
    # finalizers and labels stay editable.
    Case("label change on a pod from before the floor", _set(["metadata", "labels", "x"], "y"), True,
         operation="UPDATE", before=_tagged_tap),
    Case("every rule broken at once",
         _all(_del(["spec", "serviceAccountName"]), _del(["spec", "runtimeClassName"]), _writable_weights, _tagged_tap,
              _init("busybox:1.36")),
         False, (SA, RUNTIME, RO + "vllm", "ghcr.io/llmslo/llmslo:v0.1.0, busybox:1.36")),
]


@pytest.mark.parametrize("overlay", ["dev", "production"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_pod_matrix(policies, example_pod, case: Case, overlay: str):
    before = copy.deepcopy(example_pod)
    if case.before:
        case.before(before)
    pod = copy.deepcopy(before)
    case.change(pod)
    request = vap.Request(operation=case.operation, object=pod, namespace_labels=INFERENCE_NS,
                          old_object=before if case.operation == "UPDATE" else None,
                          sub_resource=case.sub_resource)
    decision = policies[overlay].admit(request)
    assert decision.allowed is case.allowed, decision.messages
    assert len(decision.messages) == len(case.messages), decision.messages
    for want, got in zip(case.messages, decision.messages, strict=True):
        assert want in got, (want, got)
    assert decision.reasons == ["Forbidden"] * len(case.messages)


def test_the_label_change_case_is_skipped_by_the_match_condition_not_admitted_by_a_rule(policies, example_pod):
    before = copy.deepcopy(example_pod)
    _tagged_tap(before)
    after = copy.deepcopy(before)
    after["metadata"]["labels"]["x"] = "y"
    decision = policies["production"].admit(vap.Request("UPDATE", after, INFERENCE_NS, old_object=before))
    assert decision.allowed and not decision.applied
    # The same pod created now is refused.
    assert not policies["production"].admit(vap.Request("CREATE", after, INFERENCE_NS)).allowed


def test_namespaces_without_the_inference_label_are_not_checked(policies, example_pod):
    pod = copy.deepcopy(example_pod)
    _tagged_tap(pod)
    decision = policies["production"].admit(vap.Request("CREATE", pod, {"kubernetes.io/metadata.name": "default"}))
    assert decision.allowed and not decision.applied


def test_the_ephemeral_containers_subresource_is_matched(policies, example_pod):
    pod = copy.deepcopy(example_pod)
    _debug("busybox:latest")(pod)
    request = vap.Request("UPDATE", pod, INFERENCE_NS, old_object=example_pod, sub_resource="ephemeralcontainers")
    assert policies["production"].matches(request)
    # Another subresource (pods/status) is not.
    assert not policies["production"].matches(vap.Request("UPDATE", pod, INFERENCE_NS, old_object=example_pod,
                                                          sub_resource="status"))


def test_an_expression_error_fails_closed(policies, example_pod):
    pod = copy.deepcopy(example_pod)
    del pod["spec"]["containers"]  # the API server never sends this; the policy must still not admit it
    decision = policies["production"].admit(vap.Request("CREATE", pod, INFERENCE_NS))
    assert not decision.allowed and decision.applied
    assert "expression error" in decision.messages[0] and "containers" in decision.messages[0]


def test_the_evaluator_has_teeth():
    """A policy whose validation is false denies with its message; a syntax error is refused at load."""
    policy = {"metadata": {"name": "p"}, "spec": {
        "matchConstraints": {"resourceRules": [{"operations": ["CREATE"], "resources": ["pods"]}]},
        "validations": [{"expression": "object.spec.containers.all(c, c.image.startsWith('x'))",
                         "messageExpression": "'bad: ' + object.spec.containers.map(c, c.image).join('|')"},
                        {"expression": "false", "messageExpression": "''", "message": "fallback"},
                        {"expression": "false"}]}}
    binding = {"metadata": {"name": "b"}, "spec": {"policyName": "p"}}
    pod = {"spec": {"containers": [{"image": "a"}, {"image": "b"}]}}
    decision = vap.Policy(policy, binding).admit(vap.Request("CREATE", pod, {}))
    assert decision.messages == ["bad: a|b", "fallback", "failed expression: false"]
    policy["spec"]["validations"] = [{"expression": "object.spec.("}]
    with pytest.raises(vap.PolicyError, match=r"validations\[0\]"):
        vap.Policy(policy, binding)
