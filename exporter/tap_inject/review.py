"""AdmissionReview (admission.k8s.io/v1) in, AdmissionReview out: a pure function of the request's bytes.

What the API server expects (Kubernetes' "Dynamic Admission Control", admission/v1 types): a response with the
request's `uid`, `allowed`, and for a mutation `patchType: JSONPatch` with the patch base64-encoded. A review
it can parse is always answered `allowed: true`: this webhook never refuses a pod, it adds a sidecar or
leaves the pod alone (not a Pod, not a CREATE, not opted in, already injected, a bad annotation, a bug:
unchanged, with the reason counted). A body that is not a v1 review has no uid to answer with: that is a 400,
which the API server treats as a failed call, and `failurePolicy: Ignore` admits the pod unchanged.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from typing import Any

from exporter.logs import event
from exporter.tap_inject import pod as podplan
from llmslo import conventions as c

API_VERSION = "admission.k8s.io/v1"
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
POD_RESOURCE = {"group": "", "version": "v1", "resource": "pods"}
MAX_WARNINGS = 4  # the API server shows each to the client; a few say enough
MAX_WARNING_CHARS = 240

# Outcomes: injected, or one of pod.SKIP_REASONS, or one of these errors (llm_tap_injector_errors_total{reason}).
INJECTED = "injected"
ERROR_BAD_JSON = "bad_json"
ERROR_BAD_REVIEW = "bad_review"
ERROR_TOO_LARGE = "too_large"
ERROR_BAD_HTTP = "bad_http"
# the failures an alert watches (conventions.TAP_INJECTOR_FAILURE_REASONS; HEALTH.TAP_INJECTOR_FAILING)
ERROR_INTERNAL, ERROR_TIMEOUT, ERROR_TLS, ERROR_OVERLOADED = c.TAP_INJECTOR_FAILURE_REASONS
ERROR_REASONS = (ERROR_BAD_JSON, ERROR_BAD_REVIEW, ERROR_INTERNAL, ERROR_TOO_LARGE, ERROR_BAD_HTTP, ERROR_TIMEOUT,
                 ERROR_TLS, ERROR_OVERLOADED)


@dataclass(frozen=True)
class Answer:
    """The HTTP status and body to send, and what happened: `outcome` is INJECTED, a skip reason or an error."""

    status: int
    body: bytes
    outcome: str
    error: bool = False  # outcome is an error reason (counted as an error, not a skip)


def _respond(uid: str, plan: podplan.Plan) -> bytes:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if plan.ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(plan.ops), separators=(",", ":")).encode()).decode()
    if plan.warnings:
        response["warnings"] = [w[:MAX_WARNING_CHARS] for w in plan.warnings[:MAX_WARNINGS]]
    return json.dumps({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}).encode()


def _refuse(status: int, reason: str, detail: str) -> Answer:
    return Answer(status, json.dumps({"error": detail}).encode(), reason, error=True)


def _request(body: bytes) -> dict[str, Any] | Answer:
    try:
        review = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return _refuse(400, ERROR_BAD_JSON, f"the body is not JSON ({type(exc).__name__})")
    request = review.get("request") if isinstance(review, dict) else None
    if (not isinstance(review, dict) or review.get("apiVersion") != API_VERSION
            or review.get("kind") != "AdmissionReview" or not isinstance(request, dict)
            or not isinstance(request.get("uid"), str) or not request["uid"]):
        return _refuse(400, ERROR_BAD_REVIEW, f"not an {API_VERSION} AdmissionReview with a request and its uid "
                       "(the webhook's admissionReviewVersions must be [v1])")
    return request


def decide(request: dict[str, Any], namespace_opted_in: bool, settings: podplan.InjectorSettings) -> podplan.Plan:
    """The plan for one review's request: only a Pod CREATE (not a subresource) is considered."""
    if request.get("kind") != POD_KIND or request.get("resource") != POD_RESOURCE or request.get("subResource"):
        return podplan.skip(podplan.SKIP_NOT_A_POD)
    if request.get("operation") != "CREATE":
        return podplan.skip(podplan.SKIP_NOT_CREATE)
    return podplan.plan(request.get("object"), namespace_opted_in, settings)


def answer(body: bytes, namespace_opted_in: bool, settings: podplan.InjectorSettings) -> Answer:
    """The answer to one POSTed body. A bug while planning answers allowed, unchanged (and is counted): the
    pod's rollout never depends on this webhook working."""
    request = _request(body)
    if isinstance(request, Answer):
        return request
    uid = request["uid"]
    try:
        plan = decide(request, namespace_opted_in, settings)
    except Exception as exc:  # noqa: BLE001 (any bug: the pod goes on unchanged, the error is counted and logged)
        event("tap_injector_internal_error", logging.ERROR, uid=uid[:64], error=type(exc).__name__,
              detail=str(exc)[:200])
        return Answer(200, _respond(uid, podplan.Plan()), ERROR_INTERNAL, error=True)
    if plan.ops:
        return Answer(200, _respond(uid, plan), INJECTED)
    return Answer(200, _respond(uid, plan), plan.skipped)


__all__ = ["ERROR_REASONS", "INJECTED", "Answer", "answer", "decide"]
