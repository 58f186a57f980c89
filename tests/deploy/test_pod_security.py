"""The Pod Security check (slogen/podsecurity.py), proved on Kubernetes' own admission fixtures, then run on every
install this repository renders.

The fixtures (../shared/peers/pod-security-admission, the newest policy version) are pods the API server must
admit (pass/) or refuse (fail/) at their level: the check must agree with every one of them, or it would pass an
install the cluster refuses, or refuse one it admits.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from slogen import podsecurity as ps
from tests.helpers.needs import shared_dir

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "peers" / "pod-security-admission"


def fixtures(level: str, outcome: str) -> list[Path]:
    folder = shared_dir(FIXTURES, "Kubernetes' Pod Security admission fixtures") / level / ps.POLICY_RELEASE / outcome
    files = sorted(folder.glob("*.yaml"))
    assert files, f"no fixtures in {folder}"
    return files


def pod(path: Path) -> tuple[dict, dict]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return doc.get("metadata") or {}, doc.get("spec") or {}


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_every_pass_fixture_is_admitted_at_its_level(level):
    refused = {p.name: ps.check_pod(*pod(p), level) for p in fixtures(level, "pass")}
    assert {name: v for name, v in refused.items() if v} == {}


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_every_fail_fixture_is_refused_at_its_level_by_the_control_it_names(level):
    admitted = []
    for path in fixtures(level, "fail"):
        violations = ps.check_pod(*pod(path), level)
        named = {k.lower(): k for k in ps.BASELINE | ps.RESTRICTED}[path.stem.rstrip("0123456789").lower()]
        control = ps.OVERRIDES.get(named, named) if level == "restricted" else named
        if control not in [v.control for v in violations]:
            admitted.append((path.name, [v.control for v in violations]))
    assert admitted == []


def test_a_level_admits_what_the_stricter_one_admits_and_privileged_admits_all():
    for path in fixtures("restricted", "pass"):
        assert ps.check_pod(*pod(path), "baseline") == (), path.name
    for path in fixtures("baseline", "fail") + fixtures("restricted", "fail"):
        assert ps.check_pod(*pod(path), "privileged") == (), path.name


def test_every_overlay_is_admitted_and_only_the_relay_is_warned_of(built):
    """The repository's overlays as kustomize renders them; the exporter lands in `monitoring`, which the
    overlays do not make, so it is held to restricted."""
    for name, objects in built.items():
        findings = ps.check_manifests(objects)
        assert [f.line() for f in findings if f.mode == "enforce"] == [], name
        assert {f.workload for f in findings} == {"DaemonSet llmslo-node/llmslo-podmap"}, name


def with_host_folder(objects: list[dict]) -> list[dict]:
    """The install with the exporter mounting the kubelet's folder itself, as it shipped before the relay."""
    objects = copy.deepcopy(objects)
    ds = next(o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "llmslo-exporter")
    ds["spec"]["template"]["spec"]["volumes"].append(
        {"name": "pod-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}})
    return objects


def test_the_exporter_with_the_kubelets_folder_mounted_is_refused_where_it_lands(built):
    """The defect this check was built for: the API server refuses an exporter that mounts the kubelet's folder
    in a namespace enforcing restricted (or baseline), so it must be refused here."""
    objects = with_host_folder(built["production"])
    for level, control in (("restricted", "restrictedVolumes"), ("baseline", "hostPathVolumes")):
        refused = [f for f in ps.check_manifests(objects, assume=level) if f.mode == "enforce"]
        assert [(f.workload, [v.control for v in f.violations]) for f in refused] == [
            ("DaemonSet monitoring/llmslo-exporter", [control])]
    assert [f for f in ps.check_manifests(objects, assume="privileged") if "llmslo-exporter" in f.workload] == []


def test_the_cli_exits_1_on_a_refused_pod_and_names_it(built, tmp_path, capsys):
    from slogen.cli import main

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump_all(built["production"]))
    bad.write_text(yaml.safe_dump_all(with_host_folder(built["production"])))
    assert main(["pod-security", str(good)]) == 0
    assert main(["pod-security", "--strict", str(good)]) == 1  # the relay's named exception is warned of
    capsys.readouterr()
    assert main(["pod-security", str(bad)]) == 1
    assert "refused: DaemonSet monitoring/llmslo-exporter breaks restricted" in capsys.readouterr().err
