"""The user's estate: `slogen init` with their namespaces and labels, `slogen build`, `kubectl kustomize deploy`.

Every rendered object is checked: it sits in the namespace the settings give (the exporter, rules, dashboards and
routing in `observability`; the taps' ConfigMaps, discovery Roles and ScaledObjects in `llm-chat` and `llm-batch`),
carries the settings' label, and names the image by the given digest. The floor is opt-in: `off` touches no
namespace and adds no policy, `audit` warns and admits (the floor's CEL executed on an existing vLLM Deployment by
tag, with its own service account), `enforce` denies. A label given twice with two values is refused with both
values named, wherever the two come from.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.cli import build_parser
from slogen import podsecurity

from .conftest import DEPLOY, custom_kinds, kustomize, vap

ROOT = Path(__file__).resolve().parents[2]
INFERENCE = ("llm-chat", "llm-batch")
MONITORING = "observability"
LABELS = {"release": "kps"}
IMAGE = "registry.example.org/platform/llmslo@sha256:" + "ab" * 32
RECEIVERS = ("llmslo-page=https://pager.example.org/hook", "llmslo-ticket=https://tickets.example.org/hook",
             "serving=https://serving.example.org/hook")


def slogen(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slogen.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def init_args(floor: str) -> list[str]:
    args = ["--namespace", MONITORING, "--floor", floor, "--image", IMAGE, "--team", "serving",
            "--runbook-url", "https://wiki.acme.internal/runbooks/{{alert}}", "--grafana-url", "https://grafana.acme.internal"]
    for ns in INFERENCE:
        args += ["--inference-namespace", ns]
    for k, v in LABELS.items():
        args += ["--object-label", f"{k}={v}"]
    for r in RECEIVERS:
        args += ["--receiver", r]
    return args


def initialised(root: Path, floor: str) -> Path:
    """A repository `slogen init` made, built by `slogen build --strict` inside it."""
    proc = slogen("init", str(root), *init_args(floor), cwd=root.parent)
    assert proc.returncode == 0, proc.stderr
    proc = slogen("build", "--strict", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, Path]:
    return {floor: initialised(tmp_path_factory.mktemp(floor) / "fleet", floor) for floor in ("off", "audit", "enforce")}


@pytest.fixture(scope="module")
def rendered(repos, kubectl) -> dict[str, list[dict]]:
    return {floor: kustomize(kubectl, root / "deploy") for floor, root in repos.items()}


def find(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str, name: str) -> dict:
    (obj,) = [o for o in find(objects, kind) if o["metadata"]["name"] == name]
    return obj


# Kinds that live in the monitoring namespace, the inference namespaces, or none.
MONITORING_KINDS = {"DaemonSet", "ServiceAccount", "PodMonitor", "NetworkPolicy", "PrometheusRule", "AlertmanagerConfig"}
CLUSTER_KINDS = {"Namespace", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterImagePolicy"}


PODMAP = "llmslo-node"  # the relay's own namespace (slogen/kustomize/podmap): the install's one Pod Security exception


def check_install(objects: list[dict]) -> None:
    for obj in objects:
        meta, kind = obj["metadata"], obj["kind"]
        where = f"{kind}/{meta['name']}"
        assert LABELS.items() <= meta.get("labels", {}).items(), where
        if meta.get("namespace") == PODMAP:
            assert meta["name"] in ("llmslo-podmap", "default-deny-all"), where
        elif kind in CLUSTER_KINDS:
            assert "namespace" not in meta, where
        elif kind in MONITORING_KINDS:
            assert meta["namespace"] == MONITORING, where
        elif kind in ("Role", "RoleBinding", "ScaledObject"):
            assert meta["namespace"] in INFERENCE, where
        elif kind == "ConfigMap":
            want = set(INFERENCE) if meta["name"] == "llmslo-slos" else {MONITORING}
            assert meta["namespace"] in want, where
        else:
            raise AssertionError(f"{where}: a kind the install did not make before; say where it belongs")
    # discovery: the flag names exactly the inference namespaces, a Role and RoleBinding in each, bound to the exporter
    ds = one(objects, "DaemonSet", "llmslo-exporter")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    args = build_parser().parse_args(container["args"])
    assert sorted(",".join(args.discovery_namespaces).split(",")) == sorted(INFERENCE)
    for binding in find(objects, "RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llmslo-exporter", "namespace": MONITORING}]
    assert sorted(r["metadata"]["namespace"] for r in find(objects, "Role")) == sorted(INFERENCE)
    assert not find(objects, "ClusterRole") and not find(objects, "ClusterRoleBinding")
    # the NetworkPolicy admits Prometheus from the monitoring namespace and reaches engines in the inference ones only
    policy = one(objects, "NetworkPolicy", "llmslo-exporter")
    assert policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": MONITORING}}
    (expr,) = policy["spec"]["egress"][0]["to"][0]["namespaceSelector"]["matchExpressions"]
    assert expr["operator"] == "In" and sorted(expr["values"]) == sorted(INFERENCE)
    # every alert routes under the operator's OnNamespace matcher; team serving has its receiver with its URL
    routing = one(objects, "AlertmanagerConfig", "llmslo")
    receivers = {r["name"]: r for r in routing["spec"]["receivers"]}
    assert receivers["serving"]["webhookConfigs"][0]["url"] == "https://serving.example.org/hook"
    for rule in find(objects, "PrometheusRule"):
        for group in rule["spec"]["groups"]:
            for r in group["rules"]:
                if "alert" in r:
                    assert r["labels"]["namespace"] == MONITORING, r["alert"]
    text = yaml.safe_dump_all(objects)
    assert "sha256:" + "0" * 64 not in text and "namespace: llm\n" not in text and "llmslo-system" not in text


def test_init_build_kustomize_puts_every_object_in_the_users_namespaces_with_their_labels(rendered, crd):
    check_install(rendered["off"])
    assert {"PodMonitor", "PrometheusRule", "ScaledObject", "AlertmanagerConfig"} <= custom_kinds(crd, rendered["off"])


def test_floor_off_adds_no_policy_and_leaves_the_users_namespaces_alone(rendered):
    # no label on a namespace of theirs, no admission or image policy over it: only the relay's own namespace
    # and the fence around its exception, bound to that namespace alone
    cluster = {(o["kind"], o["metadata"]["name"]) for o in rendered["off"] if o["kind"] in CLUSTER_KINDS}
    assert cluster == {("Namespace", PODMAP), ("ValidatingAdmissionPolicy", "llmslo-podmap-exception-fence"),
                       ("ValidatingAdmissionPolicyBinding", "llmslo-podmap-exception-fence")}
    fence = one(rendered["off"], "ValidatingAdmissionPolicyBinding", "llmslo-podmap-exception-fence")
    assert fence["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PODMAP}}}


@pytest.mark.parametrize("floor", ["off", "audit", "enforce"])
def test_every_pod_of_the_install_is_admitted_by_pod_security_and_the_one_exception_is_named(rendered, floor):
    """What `slogen init` scaffolds, built and rendered: no pod template breaks the level its namespace enforces
    (a namespace the install does not make, the user's monitoring one, taken to enforce restricted), and
    the only warned or audited one is the podmap relay's host folder, in its own namespace."""
    findings = podsecurity.check_manifests(rendered[floor])
    assert [f.line() for f in findings if f.mode == "enforce"] == []
    assert {(f.workload, f.mode, tuple(v.control for v in f.violations)) for f in findings} == {
        (f"DaemonSet {PODMAP}/llmslo-podmap", mode, ("hostPathVolumes",)) for mode in ("warn", "audit")}


def test_floor_audit_warns_and_audits_and_enforce_denies(rendered):
    audit, enforce = rendered["audit"], rendered["enforce"]
    check_install(audit)
    check_install(enforce)
    for objects, actions, mode in ((audit, ["Warn", "Audit"], "warn"), (enforce, ["Deny"], "enforce")):
        binding = one(objects, "ValidatingAdmissionPolicyBinding", "llmslo-inference-security-floor")
        assert binding["spec"]["validationActions"] == actions
        assert {p["spec"]["mode"] for p in find(objects, "ClusterImagePolicy")} == {mode}
        for ns in find(objects, "Namespace"):
            if ns["metadata"]["name"] == PODMAP:
                continue
            labels = ns["metadata"]["labels"]
            assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "restricted"
            assert labels.get("pod-security.kubernetes.io/enforce") == ("restricted" if mode == "enforce" else None)
    assert sorted(n["metadata"]["name"] for n in find(audit, "Namespace")) == sorted([*INFERENCE, PODMAP])


EXISTING_VLLM = {  # what a user already runs: vLLM by tag, with its own service account, no RuntimeClass
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vllm", "namespace": "llm-chat"},
    "spec": {"template": {"metadata": {"labels": {"app": "vllm"}}, "spec": {
        "serviceAccountName": "vllm-sa",
        "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                        "args": ["--model", "/models/llama"], "ports": [{"containerPort": 8000}],
                        "volumeMounts": [{"name": "models", "mountPath": "/models"}]}],
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}]}}}}


def _pod_of(deployment: dict) -> dict:
    template = copy.deepcopy(deployment["spec"]["template"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vllm-0", **template["metadata"]},
            "spec": template["spec"]}


def _policy(objects: list[dict]):
    return vap.Policy(one(objects, "ValidatingAdmissionPolicy", "llmslo-inference-security-floor"),
                      one(objects, "ValidatingAdmissionPolicyBinding", "llmslo-inference-security-floor"))


def test_audit_floor_admits_an_existing_vllm_by_tag_with_warnings(rendered):
    """The floor's CEL, executed on the user's running vLLM at its next rollout: audit warns and admits it;
    the same pod under enforce is refused, for the same reasons (so the warnings are the ones to fix)."""
    pod = _pod_of(EXISTING_VLLM)
    namespace = one(rendered["audit"], "Namespace", "llm-chat")["metadata"]["labels"]
    request = vap.Request("CREATE", pod, namespace, namespace="llm-chat")
    audit = vap.respond(_policy(rendered["audit"]), request)
    assert audit.admitted
    assert any("service account llm-inference, not vllm-sa" in w for w in audit.warnings), audit.warnings
    assert any("pinned by digest" in w and "vllm/vllm-openai:v0.11.0" in w for w in audit.warnings), audit.warnings
    assert audit.audited == audit.warnings
    enforce = vap.respond(_policy(rendered["enforce"]), request)
    assert not enforce.admitted and enforce.warnings == [] and len(enforce.audited) == 0
    assert vap.respond(_policy(rendered["enforce"]), request).admitted is False


def test_a_label_given_two_values_is_refused_naming_both(repos, tmp_path):
    root = repos["off"]
    # a flag against the settings file
    proc = slogen("build", "--check", "--object-label", "release=other", cwd=root)
    assert proc.returncode != 0 and "release=other" in proc.stderr and "release=kps" in proc.stderr, proc.stderr
    # the same flag twice
    proc = slogen("init", str(tmp_path / "x"), *init_args("off"), "--object-label", "release=kps-2", cwd=tmp_path)
    assert proc.returncode != 0 and "release=kps" in proc.stderr and "release=kps-2" in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists()
    # an object label against the dashboards' sidecar label
    proc = slogen("build", "--check", "--dashboard-label", "release=grafana", cwd=root)
    assert proc.returncode != 0 and "release=kps" in proc.stderr and "release=grafana" in proc.stderr, proc.stderr
    # an overlay over objects a build labelled otherwise
    proc = slogen("overlay", "--settings", str(root / "llmslo.yaml"), "--generated", str(root / "deploy" / "generated"),
                  "--out", str(tmp_path / "o"), "--object-label", "team=a", cwd=root)
    assert proc.returncode == 0, proc.stderr
    generated = tmp_path / "generated"
    subprocess.run(["cp", "-r", str(root / "deploy" / "generated"), str(generated)], check=True)
    rule = generated / "prometheusrule-chat.yaml"
    rule.write_text(rule.read_text().replace("release: kps", "release: kube-prometheus-stack"))
    proc = slogen("overlay", "--settings", str(root / "llmslo.yaml"), "--generated", str(generated),
                  "--out", str(tmp_path / "o2"), cwd=root)
    assert proc.returncode == 2 and "release=kps" in proc.stderr and "release=kube-prometheus-stack" in proc.stderr
    assert not (tmp_path / "o2").exists()


def test_build_refuses_the_placeholder_digest_and_a_tag(tmp_path):
    for image, why in (("ghcr.io/llmslo/llmslo@sha256:" + "0" * 64, "placeholder"), ("ghcr.io/llmslo/llmslo:v1", "digest")):
        args = [a if a != IMAGE else image for a in init_args("off")]
        proc = slogen("init", str(tmp_path / "r"), *args, cwd=tmp_path)
        assert proc.returncode == 2 and "--image" in proc.stderr and why in proc.stderr, proc.stderr
    proc = slogen("init", str(tmp_path / "r"), "--inference-namespace", "llm", cwd=tmp_path)
    assert proc.returncode == 2 and "--image" in proc.stderr


def test_the_repositorys_overlays_are_slogen_overlays_output():
    """deploy/overlays/production and dev/install are what `slogen overlay` writes for `llm` from llmslo.yaml."""
    from slogen import overlay, settings

    base = settings.load(ROOT / "llmslo.yaml")
    for out, floor in (("production", "enforce"), ("dev/install", "audit")):
        committed = DEPLOY / "overlays" / out
        s = settings.merge(base, {"inference_namespaces": ("llm",), "floor": floor})
        files = overlay.render(s, overlay.relative(DEPLOY / "generated", committed),
                               overlay.relative(overlay.BASES, committed))
        for rel, text in files.items():
            assert (committed / rel).read_text() == text, \
                f"{out}/{rel}: run slogen overlay --inference-namespace llm --floor {floor} --bases slogen/kustomize " \
                f"--out deploy/overlays/{out}"


def test_the_scaffolded_ci_check_passes_in_the_scaffolded_repository(repos):
    """Each step of the CI workflow `slogen init` writes, run in the repository it made (the installs are the
    machine's: promtool, kubectl, and slogen from this environment), pod-security among them."""
    root = repos["enforce"]
    workflow = yaml.safe_load((root / ".github" / "workflows" / "slo-check.yaml").read_text())
    steps = [s["run"] for s in workflow["jobs"]["slogen"]["steps"] if "run" in s]
    # the machine's own installs stand in for apt and pip; the generated promtool tests are run on the same
    # generator's output by tests/slogen/test_promtool.py, so here only that the step is there
    assert any(s.startswith("for f in alerts/*.test.yaml; do promtool test rules") for s in steps), steps
    runnable = [s for s in steps if not s.startswith(("sudo apt-get", "pip install", "for f in alerts/"))]
    assert any("slogen pod-security" in s for s in runnable), steps
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for step in runnable:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", step], cwd=root, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, (step, proc.stdout[-2000:], proc.stderr[-2000:])
