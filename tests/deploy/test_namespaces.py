"""Any namespace: an overlay written by tools.deploy_overlay for other names puts every object where it belongs.

The reported failure: pools in `llm-chat` and `llm-batch` got ScaledObjects but no security floor, because
the overlays named `llm` everywhere. Here a real `slogen build` makes pools in those two namespaces, the
generator writes an overlay for them with monitoring in `observability`, `kubectl kustomize` builds it,
and every object is checked: the Namespaces, their labels, the Roles and RoleBindings, the exporter's flag,
its NetworkPolicy, the tap ConfigMaps, the PrometheusRules, the ScaledObjects and their Prometheus address,
and the custom resources against their CRD schemas.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.cli import build_parser
from tools import deploy_overlay as overlay

from .conftest import custom_kinds
from .conftest import k8s as K8S

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def kustomize(kubectl: str, path: Path) -> list[dict]:
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return [d for d in K8S.load_all(proc.stdout) if d]  # kustomize writes `matchType: =` bare

POOLS = """\
version: "llmslo/autoscaling/v1"
pools:
  - name: vllm-chat
    namespace: llm-chat
    target: {kind: Deployment, name: vllm-chat}
    replicas: {min: 1, max: 4}
    match: {namespace: llm-chat, model: llama-3-8b}
    prometheus: http://prometheus-operated.observability.svc:9090
    triggers:
      queue_depth: {per_replica: 4}
  - name: vllm-batch
    namespace: llm-batch
    target: {kind: Deployment, name: vllm-batch}
    replicas: {min: 1, max: 2}
    match: {namespace: llm-batch, model: batch-70b}
    prometheus: http://prometheus-operated.observability.svc:9090
    triggers:
      kv_cache_utilization: {per_replica: 0.85}
"""
INFERENCE = ("llm-chat", "llm-batch")
MONITORING = "observability"


def find(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A checkout's deploy/ with a build of the repository's SLOs and two pools in llm-chat and llm-batch."""
    root = tmp_path_factory.mktemp("cluster")
    shutil.copytree(ROOT / "slos", root / "slos")
    (root / "autoscaling").mkdir()
    (root / "autoscaling" / "pools.yaml").write_text(POOLS)
    for part in ("base", "policy", "namespaces", "examples", "components"):
        shutil.copytree(DEPLOY / part, root / "deploy" / part)
    proc = subprocess.run([sys.executable, "-m", "slogen.cli", "build", str(root / "slos"), "--out", str(root),
                           "--no-promtool-check"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture(scope="module")
def objects(tree, kubectl) -> list[dict]:
    out = tree / "deploy" / "overlays" / "mine"
    proc = subprocess.run([sys.executable, "-m", "tools.deploy_overlay", "--inference-namespaces", ",".join(INFERENCE),
                           "--monitoring-namespace", MONITORING, "--out", str(out), "--deploy", str(tree / "deploy")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return kustomize(kubectl, out)


def check_namespaces(objects: list[dict], inference: tuple[str, ...], monitoring: str) -> None:
    """Every object that names an inference or the monitoring namespace names the configured ones."""
    namespaces = {o["metadata"]["name"]: o for o in find(objects, "Namespace")}
    assert set(inference) <= set(namespaces)
    floor = next(o for o in find(objects, "ValidatingAdmissionPolicyBinding"))
    selector = floor["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
    for ns in inference:
        labels = namespaces[ns]["metadata"]["labels"]
        assert selector.items() <= labels.items(), ns  # the security floor applies there
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # Discovery: the flag names exactly the inference namespaces, and a Role + RoleBinding in each.
    ds = next(o for o in find(objects, "DaemonSet") if o["metadata"]["name"] == "llmslo-exporter")
    args = build_parser().parse_args(ds["spec"]["template"]["spec"]["containers"][0]["args"])
    assert sorted(",".join(args.discovery_namespaces).split(",")) == sorted(inference)
    assert sorted(r["metadata"]["namespace"] for r in find(objects, "Role")) == sorted(inference)
    bindings = find(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(inference)
    exporter_ns = ds["metadata"]["namespace"]
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "llmslo-exporter", "namespace": exporter_ns}]
    assert not find(objects, "ClusterRole") and not find(objects, "ClusterRoleBinding")
    # The tap's SLO ConfigMap in every inference namespace, all with the same content hash.
    slos = [o for o in find(objects, "ConfigMap") if o["metadata"]["name"] == "llmslo-slos"]
    assert sorted(o["metadata"]["namespace"] for o in slos) == sorted(inference)
    assert len({o["metadata"]["annotations"]["llmslo.io/config-hash"] for o in slos}) == 1
    # Every ScaledObject in an inference namespace, querying the Prometheus in the monitoring namespace.
    scaled = find(objects, "ScaledObject")
    assert scaled and {o["metadata"]["namespace"] for o in scaled} <= set(inference)
    for o in scaled:
        for trigger in o["spec"]["triggers"]:
            if trigger["type"] == "prometheus":
                assert f".{monitoring}.svc:" in trigger["metadata"]["serverAddress"], trigger
    # PrometheusRules where Prometheus looks; Prometheus admitted from there; engines reached in inference ones.
    assert {o["metadata"]["namespace"] for o in find(objects, "PrometheusRule")} == {monitoring}
    policy = next(o for o in find(objects, "NetworkPolicy") if o["metadata"]["name"] == "llmslo-exporter")
    assert policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": monitoring}}
    engines = policy["spec"]["egress"][0]["to"][0]["namespaceSelector"]["matchLabels"]
    for ns in inference:
        assert engines.items() <= namespaces[ns]["metadata"]["labels"].items(), ns
    # Nothing still names the example namespaces.
    text = yaml.safe_dump_all(objects)
    if "llm" not in inference:
        assert "namespace: llm\n" not in text and 'namespace="llm"' not in text
    if monitoring != "monitoring":
        assert ".monitoring.svc" not in text and "namespace: monitoring\n" not in text


def test_overlay_for_other_namespaces_puts_every_object_there(objects):
    check_namespaces(objects, INFERENCE, MONITORING)


def test_overlay_for_other_namespaces_validates(objects, crd):
    assert {"PodMonitor", "PrometheusRule", "ScaledObject"} <= custom_kinds(crd, objects)


def test_production_overlay_is_the_generators_output_for_llm(built):
    """deploy/overlays/production is what the generator writes for `llm`, and it holds the same way."""
    out = DEPLOY / "overlays" / "production"
    files = overlay.render(overlay.OverlayParams(("llm",)), out)
    for rel, text in files.items():
        assert (out / rel).read_text() == text, f"{rel}: run python -m tools.deploy_overlay --inference-namespaces llm --out {out}"
    check_namespaces(built["production"], ("llm",), "monitoring")


def test_generator_refuses_a_pool_outside_the_inference_namespaces(tree, tmp_path):
    """The reported failure: ScaledObjects in namespaces the overlay does not know get no floor. Refused, named."""
    proc = subprocess.run([sys.executable, "-m", "tools.deploy_overlay", "--inference-namespaces", "llm-chat",
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and not (tmp_path / "o").exists()
    with pytest.raises(overlay.OverlayError) as e:
        overlay.render(overlay.OverlayParams(("llm-chat",)), tmp_path / "o", tree / "deploy")
    assert e.value.flag == "--inference-namespaces" and "vllm-batch" in str(e.value) and "llm-batch" in str(e.value)


def test_generator_refuses_autoscalers_asking_another_prometheus(tree, tmp_path):
    with pytest.raises(overlay.OverlayError) as e:
        overlay.render(overlay.OverlayParams(INFERENCE, "monitoring"), tmp_path / "o", tree / "deploy")
    assert e.value.flag == "--monitoring-namespace" and "prometheus-operated.monitoring.svc" in str(e.value)


@pytest.mark.parametrize("value", ["", "LLM", "llm_chat", "a" * 64, "llm,llm"])
def test_generator_refuses_bad_namespace_names(value):
    with pytest.raises(overlay.OverlayError) as e:
        overlay.namespace_list(value)
    assert e.value.flag == "--inference-namespaces"
