"""The inference pool as installed: `isolation:` in llmslo.yaml, `slogen build`, `kubectl kustomize deploy`.

Each named pool gets its own exporter DaemonSet, on the nodes whose pool label names it and told that pool; the
shipped DaemonSet is kept off them (so a node is read by exactly one exporter, and a node relabelled out of a pool
loses that pool's exporter); the relay tolerates the pools' taint; every pod still passes Pod Security where it
lands; and the exporter, started with what a pool's manifest gives it, says that pool.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slogen import podsecurity

from .conftest import kustomize
from .test_install import IMAGE, INFERENCE, MONITORING, PODMAP, find, init_args, one, slogen

ROOT = Path(__file__).resolve().parents[2]
LABEL = "example.org/gpu-pool"
ISOLATION = f"isolation: {{pool: inference, nodeLabel: {LABEL}, servingWorkloads: [vllm-llama], otherPools: [training]}}\n"


@pytest.fixture(scope="module")
def objects(tmp_path_factory, kubectl) -> list[dict]:
    root = tmp_path_factory.mktemp("pools") / "fleet"
    proc = slogen("init", str(root), *init_args("enforce"), cwd=root.parent)
    assert proc.returncode == 0, proc.stderr
    settings = root / "llmslo.yaml"
    settings.write_text(settings.read_text().replace("# isolation:", "# was:") + ISOLATION)
    proc = slogen("build", "--strict", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return kustomize(kubectl, root / "deploy")


def pod_spec(ds: dict) -> dict:
    return ds["spec"]["template"]["spec"]


def test_one_exporter_per_named_pool_and_the_shipped_one_off_their_nodes(objects):
    daemonsets = {d["metadata"]["name"]: d for d in find(objects, "DaemonSet") if d["metadata"]["namespace"] == MONITORING}
    assert set(daemonsets) == {"llmslo-exporter", "llmslo-exporter-inference", "llmslo-exporter-training"}
    (term,) = pod_spec(daemonsets["llmslo-exporter"])["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {"matchExpressions": [{"key": LABEL, "operator": "NotIn", "values": ["inference", "training"]}]}
    assert not any(e["name"] == "LLMSLO_NODE_POOL" for e in pod_spec(daemonsets["llmslo-exporter"])["containers"][0]["env"])
    for pool in ("inference", "training"):
        ds = daemonsets[f"llmslo-exporter-{pool}"]
        spec = pod_spec(ds)
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", LABEL: pool}
        assert {"key": LABEL, "operator": "Exists"} in spec["tolerations"]
        container = spec["containers"][0]
        assert {"name": "LLMSLO_NODE_POOL", "value": pool} in container["env"] and container["image"] == IMAGE
        assert f"--discovery-namespaces={','.join(INFERENCE)}" in container["args"]
        # its own pods only: the pool label in its selector and on its pods; the shipped selector's label too, so the
        # NetworkPolicies and the PodMonitor that select the exporter select it
        assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "llmslo-exporter",
                                                         "llmslo.io/node-pool": pool}
        assert ds["spec"]["template"]["metadata"]["labels"]["llmslo.io/node-pool"] == pool
    relay = one(objects, "DaemonSet", "llmslo-podmap")
    assert {"key": LABEL, "operator": "Exists"} in pod_spec(relay)["tolerations"]


def test_every_pod_still_passes_pod_security_where_it_lands(objects):
    findings = podsecurity.check_manifests(objects)
    assert [f.line() for f in findings if f.mode == "enforce"] == []
    assert {f.workload for f in findings} == {f"DaemonSet {PODMAP}/llmslo-podmap"}


def test_the_isolation_alerts_are_in_the_health_rules(objects):
    rules = {r["alert"]: r for pr in find(objects, "PrometheusRule") for g in pr["spec"]["groups"]
             for r in g["rules"] if "alert" in r}
    assert 'node_pool="inference"' in rules["LLMInferencePoolForeignPod"]["expr"]
    assert 'pod=~"vllm-llama-.+"' in rules["LLMServingPodOffPool"]["expr"]
    assert rules["LLMInferencePoolForeignPod"]["labels"]["namespace"] == MONITORING


@pytest.mark.parametrize("pool", ["inference", "training"])
def test_an_exporter_started_as_its_pool_manifest_says_says_that_pool(objects, pool):
    container = pod_spec(one(objects, "DaemonSet", f"llmslo-exporter-{pool}"))["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    proc = subprocess.run([sys.executable, "-m", "exporter.cli", "--once", "--gpu", "fake:1", "--node-name", "gpu-7",
                           "--pod-resources-socket", "off"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    assert f'llm_exporter_node_pool_info{{hostname="gpu-7",node_pool="{pool}"}} 1' in proc.stdout


def test_a_pool_no_longer_named_leaves_no_daemonset(tmp_path):
    from slogen import overlay
    from slogen.poolisolation import Isolation
    from slogen.settings import InstallSettings

    s = InstallSettings(inference_namespaces=("llm",), isolation=Isolation("inference", other_pools=("training",)))
    out = tmp_path / "install"
    overlay.write(overlay.render(s, "../generated", "bases"), out)
    assert sorted(p.name for p in (out / "exporter").glob("pool-*.yaml")) == ["pool-inference.yaml", "pool-training.yaml"]
    s = InstallSettings(inference_namespaces=("llm",), isolation=Isolation("inference"))
    overlay.write(overlay.render(s, "../generated", "bases"), out)
    assert sorted(p.name for p in (out / "exporter").glob("pool-*.yaml")) == ["pool-inference.yaml"]
    kustomization = yaml.safe_load((out / "exporter" / "kustomization.yaml").read_text())
    assert kustomization["resources"][1:] == ["pool-inference.yaml"]
