"""Fixtures for the tap injector: AdmissionReviews as the API server sends them, the engine pod a ReplicaSet
creates from the example Deployment (without its hand-added tap), and a CA with a serving certificate."""

from __future__ import annotations

import copy
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.tap_inject.pod import InjectorSettings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "slogen" / "kustomize" / "examples" / "inference" / "deployment-vllm.yaml"
TAP_IMAGE = "ghcr.io/llmslo/llmslo@sha256:" + "ab" * 32
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
POD_RESOURCE = {"group": "", "version": "v1", "resource": "pods"}


def _defaults(container: dict[str, Any]) -> None:
    """What the API server's defaulting adds to a container before admission (pkg/apis/core/v1/defaults.go)."""
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("imagePullPolicy", "IfNotPresent")
    for port in container.get("ports", []):
        port.setdefault("protocol", "TCP")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in container:
            container[probe].setdefault("timeoutSeconds", 1)
            container[probe].setdefault("successThreshold", 1)
            container[probe].setdefault("failureThreshold", 3)
            if "httpGet" in container[probe]:
                container[probe]["httpGet"].setdefault("scheme", "HTTP")


def engine_pod(labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The example's vLLM pod as its ReplicaSet creates it (generateName, owner, the API server's defaults),
    without the tap the example adds by hand."""
    template = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text())["spec"]["template"])
    spec = template["spec"]
    spec["containers"] = [c for c in spec["containers"] if c["name"] != "tap"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "slos"]
    annotations = {k: v for k, v in template["metadata"]["annotations"].items() if k != "llmslo.io/tap-port"}
    for c in spec["containers"]:
        _defaults(c)
    spec.update(restartPolicy="Always", dnsPolicy="ClusterFirst", schedulerName="default-scheduler",
                priority=0, preemptionPolicy="PreemptLowerPriority")
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {
            "generateName": "vllm-llama-3-8b-7d9c6b5f4-", "namespace": "llm",
            "labels": {**template["metadata"]["labels"], "pod-template-hash": "7d9c6b5f4", **(labels or {})},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-llama-3-8b-7d9c6b5f4",
                                 "uid": "2b1f0c7e-6f1d-4a43-9d51-0f3c1b7c9e11", "controller": True,
                                 "blockOwnerDeletion": True}],
        },
        "spec": spec,
        "status": {},
    }


def admission_review(obj: Any, operation: str = "CREATE", kind: dict | None = None,
                     resource: dict | None = None, sub_resource: str | None = None) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview request, every field the API server sends for a pod a
    ReplicaSet controller creates (k8s.io/api/admission/v1 AdmissionRequest)."""
    kind = kind or POD_KIND
    resource = resource or POD_RESOURCE
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": kind, "resource": resource, "requestKind": kind, "requestResource": resource,
        "name": "", "namespace": "llm", "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                     "uid": "5d4c1c4e-3b0a-4d0e-8f3e-6c1b2a9d8e7f",
                     "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]},
        "object": obj if operation != "DELETE" else None,
        "oldObject": obj if operation in ("UPDATE", "DELETE") else None,
        "dryRun": False,
        "options": {"kind": f"{operation.title()}Options", "apiVersion": "meta.k8s.io/v1"},
    }
    if sub_resource:
        request["subResource"] = sub_resource
        request["requestSubResource"] = sub_resource
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


@pytest.fixture
def settings() -> InjectorSettings:
    return InjectorSettings(tap_image=TAP_IMAGE)


@pytest.fixture
def make_pod() -> Callable[..., dict[str, Any]]:
    return engine_pod


@pytest.fixture
def make_review() -> Callable[..., dict[str, Any]]:
    return admission_review


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Any]:
    """A CA and `issue(name)`: a key pair for the webhook's Service name and 127.0.0.1, signed by it."""
    assert shutil.which("openssl"), "the TLS tests need the openssl command (Debian package openssl)"
    d = tmp_path_factory.mktemp("injector-certs")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-subj", "/CN=injector-test-ca", "-keyout", "ca.key", "-out", "ca.crt", cwd=d)

    def issue(name: str) -> tuple[Path, Path]:
        (d / f"{name}.ext").write_text(
            "subjectAltName=DNS:llmslo-tap-injector.llmslo-tap-injector.svc,IP:127.0.0.1\n")
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj",
                 f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)
        return d / f"{name}.crt", d / f"{name}.key"

    return {"ca": d / "ca.crt", "issue": issue}
