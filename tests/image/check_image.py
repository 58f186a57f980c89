"""The built image (`make image`), run as its own user with buildah: `make image-test`, a CI step.

Not collected by `make test` (the file name does not match test_*.py; buildah and a built image
are not test dependencies): `.ci/run` and `make image-test` pass the file to pytest by name.
What docs/deploy.md promises is checked against the image's config (`buildah inspect`): the
numeric user the DaemonSet's runAsUser names, the entrypoint, the exposed ports. Then the
entrypoint runs, as that user, one collection cycle on one fake GPU and prints a page that parses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import DEFAULT_PORT

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("IMAGE", "localhost/llmslo:dev")
ENV = {**os.environ, "STORAGE_DRIVER": os.environ.get("STORAGE_DRIVER", "vfs"),
       "BUILDAH_ISOLATION": os.environ.get("BUILDAH_ISOLATION", "chroot")}


def buildah(*args: str, timeout: float = 120) -> str:
    proc = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout, env=ENV)
    assert proc.returncode == 0, f"buildah {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def config() -> dict:
    if not shutil.which("buildah"):
        pytest.fail("buildah is missing: run `make image` (scripts/install-image-deps.sh installs it)")
    proc = subprocess.run(["buildah", "inspect", "--type", "image", IMAGE], capture_output=True, text=True, env=ENV)
    if proc.returncode != 0:
        pytest.fail(f"image {IMAGE} is not in buildah's storage: run `make image` first\n{proc.stderr}")
    return json.loads(proc.stdout)["OCIv1"]["config"]


@pytest.fixture(scope="module")
def container(config) -> str:
    name = buildah("from", "--pull-never", IMAGE).strip()
    yield name
    buildah("rm", name)


def documented() -> dict:
    """User, entrypoint and ports as docs/deploy.md's image section and the manifests state them."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    section = doc[doc.index("## The image"):]
    section = section[:section.index("\n## ", 1)]
    user = re.search(r"runs as the numeric user (\d+)", section)
    ports = re.search(r"exposes ports? ([\d,\sand]+)", section)
    entry = re.search(r"entrypoint is `([^`]+)`", section)
    assert user and ports and entry, "docs/deploy.md's image section must state user, entrypoint and ports"
    return {"user": int(user.group(1)), "entrypoint": entry.group(1).split(),
            "ports": {int(p) for p in re.findall(r"\d+", ports.group(1))}}


def test_user_entrypoint_and_ports_are_as_documented(config):
    doc = documented()
    uid, _, gid = config["User"].partition(":")
    assert uid.isdigit() and int(uid) == doc["user"] != 0, config["User"]  # numeric: runAsNonRoot can verify it
    daemonset = yaml.safe_load((ROOT / "slogen" / "kustomize" / "base" / "daemonset.yaml").read_text())
    assert daemonset["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)
    assert config["Entrypoint"] == doc["entrypoint"]
    exposed = {int(p.split("/")[0]) for p in config["ExposedPorts"]}
    assert exposed == doc["ports"] and DEFAULT_PORT in exposed
    print(f"\nimage {IMAGE}: user {config['User']}, entrypoint {config['Entrypoint']}, ports {sorted(exposed)}")


def test_runs_as_its_non_root_user(container):
    ids = buildah("run", container, "--", "id").strip()
    print(f"\nbuildah run {IMAGE} -- id: {ids}")
    assert re.match(r"uid=65532\b.* gid=65532\b", ids), ids


def test_the_entrypoint_prints_a_page_for_one_fake_gpu(config, container):
    command = [*config["Entrypoint"], "--once", "--gpu", "fake:1"]
    page = buildah("run", container, "--", *command)
    families = {f.name: f for f in text_string_to_metric_families(page)}
    gpus = {s.labels["gpu"] for f in families.values() for s in f.samples if "gpu" in s.labels}
    assert gpus == {"0"}, gpus
    assert families["llm_exporter_collection_cycles"].samples[0].value == 1
    memory = [f for name, f in families.items() if name.startswith("llm_gpu_memory")]
    assert memory, sorted(families)
    lines = page.splitlines()
    print(f"\nbuildah run {IMAGE} -- {' '.join(command)}: {len(lines)} lines, {len(families)} families; first samples:")
    print("\n".join([line for line in lines if not line.startswith("#")][:5]))


def test_the_podmap_relay_ships_in_the_same_image(config, container):
    """slogen/kustomize/podmap runs this image with `podmap ...` as its arguments: the subcommand is there."""
    usage = buildah("run", container, "--", *config["Entrypoint"], "podmap", "--help")
    assert "--pod-resources-socket" in usage and "--listen" in usage, usage


def test_the_build_ca_bundle_is_in_no_layer(container):
    """pip's CA bundle was a build secret: no file of the image is it, and its extra CAs are absent."""
    ca = Path(os.environ.get("PIP_CERT") or os.environ.get("REQUESTS_CA_BUNDLE") or "/etc/ssl/certs/ca-certificates.crt")
    pem = re.compile(r"-----BEGIN CERTIFICATE-----\n(.*?)-----END", re.S)
    host_bytes = ca.read_bytes()
    host = set(pem.findall(host_bytes.decode(errors="replace")))
    root = Path(buildah("mount", container).strip())
    try:
        assert not (root / "run" / "secrets" / "pip-ca").exists()
        image: set[str] = set()
        files = 0
        for d in ("etc", "opt", "usr", "run", "root", "tmp", "var"):
            for p in (root / d).rglob("*"):
                if p.suffix in (".crt", ".pem") and p.is_file() and not p.is_symlink():
                    files += 1
                    data = p.read_bytes()
                    assert data != host_bytes, f"{p.relative_to(root)} is the build's CA bundle"
                    image |= set(pem.findall(data.decode(errors="replace")))
    finally:
        buildah("umount", container)
    assert image, "the image has no CA bundle at all (ca-certificates)"
    print(f"\nhost pip CA bundle {ca}: {len(host)} certificates; the image's {files} certificate files hold "
          f"{len(image)}; {len(host - image)} of the host's (e.g. a TLS-inspecting proxy's CA) are in none of them")
