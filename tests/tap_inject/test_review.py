"""The injector's answers to real admission.k8s.io/v1 AdmissionReviews: the JSON Patch applied (python-json-patch,
an RFC 6902 implementation of its own) gives a pod with the tap, the SLO volume and the port routed through the
tap, valid against the Pod schema (kubernetes-validate, strict) and admitted by Pod Security `restricted`."""

from __future__ import annotations

import argparse
import base64
import copy
import json
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from exporter.config import KubernetesDiscovery
from exporter.tap.options import add_arguments
from exporter.tap_inject import pod as P
from exporter.tap_inject import review
from exporter.tap_inject.counters import Counters
from slogen.podsecurity import check_pod

K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())


def ask(req: dict[str, Any], settings: P.InjectorSettings, namespace: bool = False) -> tuple[dict, review.Answer]:
    """The response object of the answer to `req`, checked as the API server checks it (uid, allowed)."""
    ans = review.answer(json.dumps(req).encode(), namespace, settings)
    assert ans.status == 200, ans.body
    doc = json.loads(ans.body)
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    resp = doc["response"]
    assert resp["uid"] == req["request"]["uid"] and resp["allowed"] is True
    return resp, ans


def patched(req: dict[str, Any], resp: dict[str, Any]) -> dict[str, Any]:
    assert resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"], validate=True))
    return jsonpatch.apply_patch(req["request"]["object"], ops)


def unchanged(resp: dict[str, Any]) -> None:
    assert "patch" not in resp and "patchType" not in resp


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return found


def find_port(pod: dict[str, Any], target: str | int) -> int:
    """Where a Service's targetPort lands in the pod, as the EndpointSlice controller resolves it
    (podutil.FindPort: a name is the first container port of that name, a number is itself)."""
    if isinstance(target, int):
        return target
    for c in pod["spec"]["containers"]:
        for p in c.get("ports", []):
            if p.get("name") == target:
                return p["containerPort"]
    raise LookupError(target)


def test_an_opted_in_pod_gets_the_tap_the_volume_and_its_port_routed_through_it(make_pod, make_review, settings):
    req = make_review(make_pod({P.LABEL_TAP: P.ENABLED}))
    resp, ans = ask(req, settings)
    assert ans.outcome == review.INJECTED
    pod = patched(req, resp)
    tap, vllm = container(pod, P.TAP_CONTAINER), container(pod, "vllm")
    assert [c["name"] for c in pod["spec"]["containers"]] == ["vllm", P.TAP_CONTAINER]  # the engine stays default
    # The Service's `targetPort: http` now reaches the tap; the engine keeps its number, renamed.
    assert find_port(pod, "http") == 8001 and {"name": "http", "containerPort": 8001, "protocol": "TCP"} in tap["ports"]
    assert vllm["ports"] == [{"name": P.ENGINE_PORT_NAME, "containerPort": 8000, "protocol": "TCP"}]
    assert vllm["args"] == req["request"]["object"]["spec"]["containers"][0]["args"]  # the engine's flags untouched
    # Its probes named the port: they follow the rename, so they still probe the engine itself.
    assert vllm["startupProbe"]["httpGet"]["port"] == vllm["readinessProbe"]["httpGet"]["port"] == P.ENGINE_PORT_NAME
    # The tap's own parser reads its arguments: in front of the engine, the SLOs from the mounted ConfigMap.
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(tap["args"][1:])
    assert tap["args"][0] == "tap" and args.upstream == "http://127.0.0.1:8000"
    assert args.listen == ("0.0.0.0", 8001) and args.metrics_listen == ("0.0.0.0", 9402)
    assert args.slo == [P.SLO_MOUNT]
    assert tap["volumeMounts"] == [{"name": P.TAP_VOLUME, "mountPath": P.SLO_MOUNT, "readOnly": True}]
    assert {"name": P.TAP_VOLUME, "configMap": {"name": "llmslo-slos"}} in pod["spec"]["volumes"]
    assert tap["image"] == settings.tap_image
    annotations = pod["metadata"]["annotations"]
    assert annotations[P.ANNOTATION_INJECTED] == "true" and annotations["llmslo.io/tap-port"] == "9402"
    assert annotations["llmslo.io/metrics-port"] == "8000"  # was there already: kept
    assert pod["metadata"]["labels"]["llmslo.io/engine"] == "vllm"  # was there already: kept


def test_the_patched_pod_is_valid_against_the_pod_schema_and_admitted_by_restricted(make_pod, make_review, settings):
    req = make_review(make_pod({P.LABEL_TAP: P.ENABLED}))
    pod = patched(req, ask(req, settings)[0])
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
    assert check_pod(pod["metadata"], pod["spec"], "restricted") == ()
    sc = container(pod, P.TAP_CONTAINER)["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    resources = container(pod, P.TAP_CONTAINER)["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}


def test_the_pod_schema_check_has_teeth(make_pod, make_review, settings):
    """A tap container with a field the schema does not know is refused, so the check above checks."""
    req = make_review(make_pod({P.LABEL_TAP: P.ENABLED}))
    pod = patched(req, ask(req, settings)[0])
    container(pod, P.TAP_CONTAINER)["ports"][0]["containerPort"] = "8001"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSIONS[-1], strict=True)


def test_a_pod_that_did_not_opt_in_is_allowed_unchanged(make_pod, make_review, settings):
    for labels in ({}, {P.LABEL_TAP: "yes"}, {P.LABEL_TAP: P.DISABLED}):
        resp, ans = ask(make_review(make_pod(labels)), settings)
        unchanged(resp)
        assert ans.outcome == (P.SKIP_OPTED_OUT if labels.get(P.LABEL_TAP) == P.DISABLED else P.SKIP_NOT_OPTED_IN)


def test_a_namespace_opt_in_injects_unlabelled_pods_and_the_pod_label_opts_out(make_pod, make_review, settings):
    req = make_review(make_pod())
    resp, ans = ask(req, settings, namespace=True)
    assert ans.outcome == review.INJECTED and find_port(patched(req, resp), "http") == 8001
    resp, ans = ask(make_review(make_pod({P.LABEL_TAP: P.DISABLED})), settings, namespace=True)
    unchanged(resp)
    assert ans.outcome == P.SKIP_OPTED_OUT


def test_an_injected_pod_is_not_injected_twice(make_pod, make_review, settings):
    req = make_review(make_pod({P.LABEL_TAP: P.ENABLED}))
    once = patched(req, ask(req, settings)[0])
    resp, ans = ask(make_review(once), settings)
    unchanged(resp)
    assert ans.outcome == P.SKIP_ALREADY_INJECTED
    # The mark alone, and a tap added by hand as the example does (a container running `tap`), count too.
    marked = make_pod({P.LABEL_TAP: P.ENABLED})
    marked["metadata"]["annotations"][P.ANNOTATION_INJECTED] = "true"
    assert ask(make_review(marked), settings)[1].outcome == P.SKIP_ALREADY_INJECTED
    by_hand = make_pod({P.LABEL_TAP: P.ENABLED})
    by_hand["spec"]["containers"].append({"name": "tap", "image": settings.tap_image, "args": ["tap", "--listen", "x"]})
    assert ask(make_review(by_hand), settings)[1].outcome == P.SKIP_ALREADY_INJECTED


@pytest.mark.parametrize(("operation", "kind", "resource", "sub", "reason"), [
    ("UPDATE", None, None, None, P.SKIP_NOT_CREATE),
    ("DELETE", None, None, None, P.SKIP_NOT_CREATE),
    ("CONNECT", None, None, None, P.SKIP_NOT_CREATE),
    ("CREATE", {"group": "apps", "version": "v1", "kind": "Deployment"},
     {"group": "apps", "version": "v1", "resource": "deployments"}, None, P.SKIP_NOT_A_POD),
    ("UPDATE", None, None, "ephemeralcontainers", P.SKIP_NOT_A_POD),
    ("CREATE", {"group": "policy", "version": "v1", "kind": "Eviction"}, None, "eviction", P.SKIP_NOT_A_POD),
])
def test_anything_but_a_pod_create_is_allowed_unchanged(make_pod, make_review, settings, operation, kind, resource,
                                                       sub, reason):
    req = make_review(make_pod({P.LABEL_TAP: P.ENABLED}), operation, kind, resource, sub)
    resp, ans = ask(req, settings)
    unchanged(resp)
    assert ans.outcome == reason and not ans.error


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe", b"[]", b"null", b'{"kind": "AdmissionReview"}',
                                  b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", '
                                  b'"request": {"uid": "u"}}',
                                  b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
                                  b"[" * 100_000])
def test_a_body_that_is_no_v1_review_is_a_400_counted_as_an_error(settings, body):
    ans = review.answer(body, False, settings)
    assert ans.status == 400 and ans.error and ans.outcome in (review.ERROR_BAD_JSON, review.ERROR_BAD_REVIEW)
    assert "error" in json.loads(ans.body)


@pytest.mark.parametrize("obj", [None, [], {"metadata": {}}, {"metadata": {}, "spec": {"containers": []}},
                                 {"metadata": {"labels": "x"}, "spec": {"containers": [{}]}},
                                 {"metadata": {}, "spec": {"containers": ["vllm"]}}])
def test_a_malformed_pod_is_allowed_unchanged(make_review, settings, obj):
    resp, ans = ask(make_review(obj), settings)
    unchanged(resp)
    assert ans.outcome == P.SKIP_MALFORMED


def test_a_bug_answers_allowed_unchanged_and_is_counted(make_pod, make_review, settings, monkeypatch):
    def boom(*_: Any) -> P.Plan:
        raise KeyError("surprise")

    monkeypatch.setattr(P, "plan", boom)
    resp, ans = ask(make_review(make_pod({P.LABEL_TAP: P.ENABLED})), settings)
    unchanged(resp)
    counters = Counters()
    counters.count(ans)
    assert ans.error and ans.outcome == review.ERROR_INTERNAL and counters.errors[review.ERROR_INTERNAL] == 1


def test_annotations_move_the_ports_and_name_the_configmap(make_pod, make_review, settings):
    pod = make_pod({P.LABEL_TAP: P.ENABLED})
    pod["metadata"]["annotations"].update({
        P.ANNOTATION_LISTEN_PORT: "8100", "llmslo.io/tap-port": "9500", P.ANNOTATION_ENGINE_PORT: "8000",
        P.ANNOTATION_SLO_CONFIGMAP: "team-a-slos"})
    req = make_review(pod)
    out = patched(req, ask(req, settings)[0])
    args = container(out, P.TAP_CONTAINER)["args"]
    assert args[args.index("--listen") + 1] == "0.0.0.0:8100" and find_port(out, "http") == 8100
    assert args[args.index("--metrics-listen") + 1] == "0.0.0.0:9500"
    assert out["metadata"]["annotations"]["llmslo.io/tap-port"] == "9500"
    assert {"name": P.TAP_VOLUME, "configMap": {"name": "team-a-slos"}} in out["spec"]["volumes"]


def test_production_stacks_port_name_by_annotation(make_pod, make_review, settings):
    """vLLM production-stack names the engine's port `container-port` and its Service targets that name."""
    pod = make_pod({P.LABEL_TAP: P.ENABLED})
    vllm = pod["spec"]["containers"][0]
    vllm["ports"] = [{"name": "container-port", "containerPort": 8000, "protocol": "TCP"},
                     {"name": "zmq-port", "containerPort": 55555, "protocol": "TCP"}]
    vllm["readinessProbe"]["httpGet"]["port"] = 8000  # the chart's probes use the number
    del pod["metadata"]["annotations"]["llmslo.io/metrics-port"]
    pod["metadata"]["annotations"][P.ANNOTATION_PORT_NAME] = "container-port"
    req = make_review(pod)
    out = patched(req, ask(req, settings)[0])
    assert find_port(out, "container-port") == 8001 and find_port(out, "zmq-port") == 55555
    assert container(out, "vllm")["readinessProbe"]["httpGet"]["port"] == 8000
    # The exporter's fallback (the pod's only port) no longer holds: the engine's metrics port is written.
    assert out["metadata"]["annotations"]["llmslo.io/metrics-port"] == "8000"


@pytest.mark.parametrize(("annotations", "reason", "says"), [
    ({P.ANNOTATION_LISTEN_PORT: "http"}, P.SKIP_BAD_ANNOTATION, P.ANNOTATION_LISTEN_PORT),
    ({P.ANNOTATION_LISTEN_PORT: "70000"}, P.SKIP_BAD_ANNOTATION, P.ANNOTATION_LISTEN_PORT),
    ({"llmslo.io/tap-port": "-1"}, P.SKIP_BAD_ANNOTATION, "llmslo.io/tap-port"),
    ({P.ANNOTATION_LISTEN_PORT: "9" * 5000}, P.SKIP_BAD_ANNOTATION, P.ANNOTATION_LISTEN_PORT),  # past int()'s limit
    ({P.ANNOTATION_LISTEN_PORT: "80\u00b2"}, P.SKIP_BAD_ANNOTATION, P.ANNOTATION_LISTEN_PORT),  # a digit to isdigit()
    ({P.ANNOTATION_PORT_NAME: "Not_A_Port"}, P.SKIP_BAD_ANNOTATION, P.ANNOTATION_PORT_NAME),
    ({P.ANNOTATION_SLO_CONFIGMAP: "../etc"}, P.SKIP_BAD_ANNOTATION, P.ANNOTATION_SLO_CONFIGMAP),
    ({P.ANNOTATION_PORT_NAME: "grpc"}, P.SKIP_NO_SERVING_PORT, "grpc"),
    ({P.ANNOTATION_LISTEN_PORT: "8000"}, P.SKIP_PORT_CONFLICT, "8000"),
    ({P.ANNOTATION_LISTEN_PORT: "9402"}, P.SKIP_PORT_CONFLICT, "9402"),
])
def test_a_bad_or_conflicting_annotation_leaves_the_pod_alone_and_tells_its_author(make_pod, make_review, settings,
                                                                                annotations, reason, says):
    pod = make_pod({P.LABEL_TAP: P.ENABLED})
    pod["metadata"]["annotations"].update(annotations)
    resp, ans = ask(make_review(pod), settings)
    unchanged(resp)
    assert ans.outcome == reason
    assert len(resp["warnings"]) == 1 and says in resp["warnings"][0] and "not injected" in resp["warnings"][0]


def test_a_pod_on_the_nodes_network_is_left_alone(make_pod, make_review, settings):
    pod = make_pod({P.LABEL_TAP: P.ENABLED})
    pod["spec"]["hostNetwork"] = True
    resp, ans = ask(make_review(pod), settings)
    unchanged(resp)
    assert ans.outcome == P.SKIP_HOST_NETWORK and "hostNetwork" in resp["warnings"][0]


def test_names_the_tap_needs_already_taken_leave_the_pod_alone(make_pod, make_review, settings):
    pod = make_pod({P.LABEL_TAP: P.ENABLED})
    pod["spec"]["containers"][0]["ports"].append({"name": P.ENGINE_PORT_NAME, "containerPort": 7000})
    assert ask(make_review(pod), settings)[1].outcome == P.SKIP_NAME_CONFLICT
    pod = make_pod({P.LABEL_TAP: P.ENABLED})
    pod["spec"]["volumes"].append({"name": P.TAP_VOLUME, "emptyDir": {}})
    assert ask(make_review(pod), settings)[1].outcome == P.SKIP_NAME_CONFLICT


def test_a_bare_pod_gets_the_maps_and_lists_it_lacks(make_review, settings):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {P.LABEL_TAP: P.ENABLED}},
           "spec": {"containers": [{"name": "engine-x", "image": "e@sha256:" + "1" * 64,
                                    "ports": [{"name": "http", "containerPort": 8080}]}]}}
    req = make_review(pod)
    out = patched(req, ask(req, settings)[0])
    assert out["metadata"]["annotations"] == {P.ANNOTATION_INJECTED: "true", "llmslo.io/tap-port": "9402",
                                              "llmslo.io/metrics-port": "8080"}
    assert out["metadata"]["labels"]["llmslo.io/engine"] == "auto"
    assert out["spec"]["volumes"] == [{"name": P.TAP_VOLUME, "configMap": {"name": "llmslo-slos"}}]
    args = container(out, P.TAP_CONTAINER)["args"]
    assert args[args.index("--upstream") + 1] == "http://127.0.0.1:8080"
    kubernetes_validate.validate(out, K8S_VERSIONS[-1], strict=True)


def test_annotation_keys_in_the_patch_are_escaped_json_pointers(make_pod, make_review, settings):
    req = make_review(make_pod({P.LABEL_TAP: P.ENABLED}))
    ops = json.loads(base64.b64decode(ask(req, settings)[0]["patch"]))
    paths = [op["path"] for op in ops]
    assert "/metadata/annotations/llmslo.io~1tap-injected" in paths
    assert P.pointer("a~b", "c/d", 0) == "/a~0b/c~1d/0"
    # Applying the patch leaves the request's own object as it was (no op aliases another).
    before = copy.deepcopy(req["request"]["object"])
    jsonpatch.apply_patch(req["request"]["object"], ops)
    assert req["request"]["object"] == before


def test_the_tap_metrics_annotation_is_the_one_the_exporter_reads():
    assert KubernetesDiscovery().tap_port_annotation == P.ANNOTATION_TAP_METRICS_PORT
    assert KubernetesDiscovery().port_annotation == P.ANNOTATION_METRICS_PORT


@pytest.mark.parametrize(("image", "ok"), [
    ("ghcr.io/llmslo/llmslo@sha256:" + "ab" * 32, True),
    ("ghcr.io/llmslo/llmslo:0.1.0", False),
    ("ghcr.io/llmslo/llmslo@sha256:" + "0" * 64, False),
    ("ghcr.io/llmslo/llmslo@sha256:" + "AB" * 32, False),
    ("", False),
])
def test_the_tap_image_must_be_pinned_by_digest(image, ok):
    problems = P.InjectorSettings(tap_image=image).problems()
    assert (problems == []) == ok and all("--tap-image" in p for p in problems)


def test_the_counters_page_has_every_reason_from_the_start():
    from exporter import promtext
    from llmslo import conventions as c

    counters = Counters()
    counters.add(review.INJECTED)
    counters.add(P.SKIP_OPTED_OUT)
    counters.add(review.ERROR_TOO_LARGE, error=True)
    families = promtext.parse_page(counters.render().decode()).families  # the exporter's own parser reads it
    assert {f + "_total" for f in families} == {m.name for m in c.TAP_INJECTOR_METRICS}
    page = counters.render().decode()
    assert f"{c.TAP_INJECTOR_INJECTED.name} 1\n" in page
    assert f'{c.TAP_INJECTOR_SKIPPED.name}{{reason="{P.SKIP_OPTED_OUT}"}} 1\n' in page
    assert f'{c.TAP_INJECTOR_ERRORS.name}{{reason="{review.ERROR_TOO_LARGE}"}} 1\n' in page
    for reason in P.SKIP_REASONS:
        assert f'{c.TAP_INJECTOR_SKIPPED.name}{{reason="{reason}"}} ' in page
