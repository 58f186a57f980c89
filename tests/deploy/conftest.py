"""Fixtures for the deploy/ tests: every overlay built by the real kustomize in kubectl."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.needs import command, shared_dir

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.parent.name for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))


def _load(name: str, path: Path):
    """A helper module by path (tests are imported with --import-mode=importlib, not from sys.path)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


k8s = _load("llmslo_tests_k8s_schemas", ROOT / "tests" / "artifacts" / "k8s_schemas.py")
vap = _load("llmslo_tests_vap", Path(__file__).with_name("vap.py"))


@pytest.fixture(scope="session")
def kubectl() -> str:
    return command("kubectl", "install kubectl: its built-in kustomize builds deploy/overlays")


def kustomize(kubectl: str, path: Path) -> list[dict]:
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return [d for d in k8s.load_all(proc.stdout) if d]  # kustomize writes `matchType: =` bare


@pytest.fixture(scope="session")
def built(kubectl) -> dict[str, list[dict]]:
    """Overlay name -> the objects `kubectl kustomize deploy/overlays/<name>` renders."""
    return {name: kustomize(kubectl, DEPLOY / "overlays" / name) for name in OVERLAYS}


def custom_kinds(crd, objects: list[dict], where: str = "") -> set[str]:
    """The kinds of the custom resources in `objects`, each asserted valid against its CRD (`where` names the
    overlay in a failure)."""
    seen = set()
    for obj in objects:
        if crd.is_custom(obj):
            assert crd.crd_errors(obj) == [], f"{where}{obj['kind']}/{obj['metadata']['name']}"
            seen.add(obj["kind"])
    return seen


@pytest.fixture(scope="session")
def crd():
    shared_dir(k8s.SHARED, "CRD schemas")
    return k8s


