"""`tapInjector: true` in llmslo.yaml: the tap injector joins the install `slogen build` writes, with the install's
image (the injector's and the sidecar's it injects), the install's labels, and a webhook that never blocks a rollout.

Off (the default) the install has no webhook at all: it needs a certificate (cert-manager) that not every cluster
has, and a webhook registered without its server would only be skipped, never noticed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slogen import podsecurity

from .conftest import kustomize
from .test_install import IMAGE, LABELS, MONITORING, initialised

INJECTOR = "llmslo-tap-injector"


def _with_injector(root: Path, on: bool) -> Path:
    settings = root / "llmslo.yaml"
    text = settings.read_text()
    for value in ("true", "false"):
        text = text.replace(f"tapInjector: {value}", f"tapInjector: {'true' if on else 'false'}")
    settings.write_text(text)
    assert yaml.safe_load(text)["tapInjector"] is on
    return root


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return initialised(tmp_path_factory.mktemp("injector") / "fleet", "enforce")


def _build(root: Path) -> None:
    from .test_install import slogen

    proc = slogen("build", "--strict", cwd=root)
    assert proc.returncode == 0, proc.stderr


def test_off_by_default_the_install_has_no_webhook(repo, kubectl):
    assert yaml.safe_load((repo / "llmslo.yaml").read_text())["tapInjector"] is False  # slogen init writes it, off
    objects = kustomize(kubectl, repo / "deploy")
    assert [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"] == []
    assert not (repo / "deploy" / "install" / "tap-injector").exists()


def test_on_the_injector_carries_the_installs_image_and_labels_and_fails_open(repo, kubectl):
    _build(_with_injector(repo, True))
    objects = kustomize(kubectl, repo / "deploy")
    (webhooks,) = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    assert {w["failurePolicy"] for w in webhooks["webhooks"]} == {"Ignore"}  # a webhook outage never blocks a rollout
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == INJECTOR]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["LLMSLO_TAP_IMAGE"] == IMAGE  # the sidecar it injects: the same digest
    injector_objects = [o for o in objects if o["metadata"].get("namespace") == INJECTOR
                        or o["kind"] == "MutatingWebhookConfiguration"]
    assert len(injector_objects) >= 6
    for obj in injector_objects:
        assert LABELS.items() <= obj["metadata"].get("labels", {}).items(), f"{obj['kind']}/{obj['metadata']['name']}"
    # Prometheus, in the install's namespace, may read the counters its PodMonitor scrapes
    (policy,) = [o for o in injector_objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == INJECTOR]
    assert policy["spec"]["ingress"][1]["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": MONITORING}}
    assert policy["spec"]["ingress"][1]["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    (monitor,) = [o for o in injector_objects if o["kind"] == "PodMonitor"]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    # the rest of the install is where it was
    assert any(o["kind"] == "DaemonSet" and o["metadata"].get("namespace") == MONITORING for o in objects)
    findings = podsecurity.check_manifests(objects)
    assert [f.line() for f in findings if f.mode == "enforce"] == []
    assert not [f for f in findings if INJECTOR in f.workload]


def test_its_podmonitor_is_valid_against_the_operators_crd(repo, kubectl, crd):
    _build(_with_injector(repo, True))
    (monitor,) = [o for o in kustomize(kubectl, repo / "deploy")
                  if o["kind"] == "PodMonitor" and o["metadata"].get("namespace") == INJECTOR]
    assert crd.crd_errors(monitor) == []


def test_turned_off_again_the_webhook_and_its_directory_go(repo, kubectl):
    _build(_with_injector(repo, True))
    assert (repo / "deploy" / "install" / "tap-injector" / "kustomization.yaml").exists()
    _build(_with_injector(repo, False))
    assert not (repo / "deploy" / "install" / "tap-injector").exists()
    assert [o for o in kustomize(kubectl, repo / "deploy") if o["kind"] == "MutatingWebhookConfiguration"] == []
