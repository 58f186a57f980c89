"""Installed, not checked out: the wheel and the sdist, installed into a new virtualenv in a folder with no
checkout, run every command a user runs.

The wheel is built from this tree (`pip wheel --no-deps`), the sdist too (`python -m build --sdist` when the
`build` package is there, and its own wheel built from it), each installed with `--no-deps` into a fresh venv
under a temporary folder. The dependencies come from the project's own environment through a path entry
(never its editable install of this checkout: a plain path line in a .pth file runs none of that folder's .pth
files), so the test costs seconds, not a download, and every module it imports of this project comes from
the installed package: the test asserts it. Then, from a folder outside the checkout: `slogen init` with the
user's namespaces and labels, `slogen build --strict`, `kubectl kustomize deploy` with every object checked
(tests/deploy/test_install.py's checks), `slogen overlay`, the exporter's page, the simulator serving, the load
generator through the goodput tap, and `--version` of each.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from importlib import metadata
from pathlib import Path

import pytest

from tests.deploy.conftest import kustomize
from tests.deploy.test_install import check_install, init_args
from tests.helpers.needs import command

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("slogen", "llmslo-exporter", "llmslo-sim", "llmslo-load")


def _run(args: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return env


def _venv(where: Path, wheel: Path) -> Path:
    venv = where / "venv"
    assert _run([sys.executable, "-m", "venv", "--without-pip", venv]).returncode == 0
    site = Path(_run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                     ).stdout.strip())
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # no PYTHONPATH: a checkout on it (with the egg-info a build leaves there) would read as installed already
    proc = _run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-deps",
                 "--no-index", wheel], env=_clean_env(venv))
    assert proc.returncode == 0, proc.stderr
    return venv


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    proc = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, ROOT])
    assert proc.returncode == 0, proc.stderr
    found = {"wheel": next(out.glob("llmslo-*.whl"))}
    try:
        metadata.version("build")  # the PyPA `build` package (not this checkout's setuptools build/ folder)
    except metadata.PackageNotFoundError:
        return found
    sdist_dir = tmp_path_factory.mktemp("sdist")
    proc = _run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", sdist_dir, ROOT])
    assert proc.returncode == 0, proc.stderr
    sdist = next(sdist_dir.glob("llmslo-*.tar.gz"))
    proc = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", sdist_dir, sdist])
    assert proc.returncode == 0, proc.stderr
    found["sdist"] = next(sdist_dir.glob("llmslo-*.whl"))
    return found


@pytest.fixture(scope="module", params=["wheel", "sdist"])
def installed(request, dists, tmp_path_factory) -> tuple[Path, Path]:
    """(the venv, a work folder outside the checkout) for the wheel and for the sdist's build."""
    if request.param not in dists:
        pytest.skip("the `build` package is not installed: the sdist is not built (pip install '.[test]')")
    where = tmp_path_factory.mktemp(f"user-{request.param}")
    assert ROOT not in where.parents
    return _venv(where, dists[request.param]), where


def test_every_module_comes_from_the_installed_package(installed):
    venv, where = installed
    code = ("import exporter, exporter.tap, llmslo, simulator, slogen, slogen.kustomize as k; "
            "print([m.__file__ or m.__path__[0] for m in (exporter, exporter.tap, llmslo, simulator, slogen)])")
    proc = _run([venv / "bin" / "python", "-c", code.replace(", slogen.kustomize as k", "")], cwd=where,
                env=_clean_env(venv))
    assert proc.returncode == 0, proc.stderr
    assert str(ROOT) not in proc.stdout and str(venv) in proc.stdout, proc.stdout
    for name in COMMANDS:
        proc = _run([venv / "bin" / name, "--help"], cwd=where, env=_clean_env(venv))
        assert proc.returncode == 0, (name, proc.stderr)
    versions = {name: _run([venv / "bin" / name, "--version"], cwd=where, env=_clean_env(venv)).stdout
                for name in ("slogen", "llmslo-exporter")}
    assert all(metadata.version("llmslo") in text for text in versions.values()), versions


def test_init_build_kustomize_from_the_installed_package(installed, kubectl):
    venv, where = installed
    env = _clean_env(venv)
    repo = where / "fleet"
    proc = _run([venv / "bin" / "slogen", "init", repo, *init_args("off")], cwd=where, env=env)
    assert proc.returncode == 0, proc.stderr
    proc = _run([venv / "bin" / "slogen", "build", "--strict"], cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr
    bases = repo / "deploy" / "install" / "bases"
    assert (bases / "base" / "daemonset.yaml").is_file() and not list(repo.rglob("*.pyc"))
    objects = kustomize(kubectl, repo / "deploy")
    check_install(objects)
    text = "\n".join(p.read_text() for p in repo.rglob("*.yaml"))
    assert str(ROOT) not in text  # nothing refers to the checkout
    # the overlay generator, as a subcommand of the installed command
    proc = _run([venv / "bin" / "slogen", "overlay", "--out", where / "again"], cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr
    assert len(kustomize(kubectl, where / "again")) == len(objects)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, deadline: float = 30) -> str:
    end = time.monotonic() + deadline
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read().decode()
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_the_engine_the_tap_the_load_and_the_exporter_run_installed(installed):
    venv, where = installed
    env = _clean_env(venv)
    page = _run([venv / "bin" / "llmslo-exporter", "--once", "--gpu", "fake:1"], cwd=where, env=env)
    assert page.returncode == 0 and re.search(r"^llm_gpu_up\{.*\} 1", page.stdout, re.M), page.stderr[-2000:]
    sim, tap, tap_metrics = _free_port(), _free_port(), _free_port()
    procs = [subprocess.Popen([venv / "bin" / "llmslo-sim", "serve", "--port", str(sim), "--preset", "tiny-llama-cpu"],
                              cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        _wait(f"http://127.0.0.1:{sim}/metrics")
        procs.append(subprocess.Popen([venv / "bin" / "llmslo-exporter", "tap", "--listen", f"127.0.0.1:{tap}",
                                       "--upstream", f"http://127.0.0.1:{sim}", "--metrics-listen",
                                       f"127.0.0.1:{tap_metrics}"], cwd=where, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(f"http://127.0.0.1:{tap_metrics}/metrics")
        load = _run([venv / "bin" / "llmslo-load", "--url", f"http://127.0.0.1:{tap}", "--rate", "5",
                     "--num-requests", "6", "--output-len", "8", "--json"], cwd=where, env=env, timeout=120)
        assert load.returncode == 0, load.stderr[-2000:]
        assert json.loads(load.stdout)["completed"] == 6, load.stdout
        counted = _wait(f"http://127.0.0.1:{tap_metrics}/metrics")
        total = sum(float(m.group(1)) for m in re.finditer(r"^llm_tap_requests_total\{[^}]*\} (\S+)", counted, re.M))
        assert total == 6, counted[-3000:]
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def kubectl() -> str:
    return command("kubectl", "install kubectl: its built-in kustomize builds the install")
