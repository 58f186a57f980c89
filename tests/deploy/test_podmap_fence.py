"""The fence around the install's one Pod Security exception (slogen/kustomize/podmap/exception-fence.yaml):
its CEL executed on the shipped relay's pod, which it must admit, and on pods the `privileged` level of
llmslo-node would admit but the fence must refuse (another host folder, a writable mount, privilege,
capabilities, host namespaces and ports, ephemeral containers). Outside llmslo-node it never applies.
"""

from __future__ import annotations

import copy

import pytest

from .conftest import vap

NAMESPACE = "llmslo-node"
LABELS = {"kubernetes.io/metadata.name": NAMESPACE}


def one(objects: list[dict], kind: str, name: str) -> dict:
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


@pytest.fixture(scope="module")
def fence(built):
    objects = built["production"]
    return vap.Policy(one(objects, "ValidatingAdmissionPolicy", "llmslo-podmap-exception-fence"),
                      one(objects, "ValidatingAdmissionPolicyBinding", "llmslo-podmap-exception-fence"))


@pytest.fixture(scope="module")
def relay_pod(built) -> dict:
    template = one(built["production"], "DaemonSet", "llmslo-podmap")["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llmslo-podmap-x", **template["metadata"]},
            "spec": copy.deepcopy(template["spec"])}


def decide(fence, pod: dict, labels: dict = LABELS, namespace: str = NAMESPACE) -> vap.Outcome:
    return vap.respond(fence, vap.Request("CREATE", pod, labels, namespace=namespace))


def test_the_shipped_relay_is_admitted(fence, relay_pod):
    assert decide(fence, relay_pod).admitted


def _another_folder(spec):
    spec["volumes"].append({"name": "root", "hostPath": {"path": "/"}})


def _writable(spec):
    spec["containers"][0]["volumeMounts"][0]["readOnly"] = False


def _privileged(spec):
    spec["containers"][0]["securityContext"]["privileged"] = True


def _capability(spec):
    spec["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]


def _keeps_capabilities(spec):
    del spec["containers"][0]["securityContext"]["capabilities"]


def _escalates(spec):
    spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True


def _host_network(spec):
    spec["hostNetwork"] = True


def _host_pid(spec):
    spec["hostPID"] = True


def _host_port(spec):
    spec["containers"][0]["ports"][0]["hostPort"] = 9412


def _second_container(spec):
    spec["containers"].append({"name": "shell", "image": "busybox"})


def _ephemeral(spec):
    spec["ephemeralContainers"] = [{"name": "debug", "image": "busybox", "securityContext": copy.deepcopy(
        spec["containers"][0]["securityContext"])}]


@pytest.mark.parametrize("change", [_another_folder, _writable, _privileged, _capability, _keeps_capabilities,
                                    _escalates, _host_network, _host_pid, _host_port, _second_container, _ephemeral])
def test_what_privileged_would_admit_beyond_the_relay_is_refused(fence, relay_pod, change):
    pod = copy.deepcopy(relay_pod)
    change(pod["spec"])
    assert not decide(fence, pod).admitted
    # refused by a rule of the fence, with its message: not by an expression that failed to evaluate
    messages = fence.admit(vap.Request("CREATE", pod, LABELS, namespace=NAMESPACE)).messages
    assert messages and all("llmslo-node" in m for m in messages), messages


def test_the_fence_applies_in_llmslo_node_only(fence, relay_pod):
    pod = copy.deepcopy(relay_pod)
    _another_folder(pod["spec"])
    assert decide(fence, pod, {"kubernetes.io/metadata.name": "other"}, "other").admitted
