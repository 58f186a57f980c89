"""slogen/kustomize/policy/image-signatures.yaml: sigstore policy-controller ClusterImagePolicies.

Checked three ways: against the ClusterImagePolicy v1beta1 schema with unknown fields rejected
(tests/deploy/clusterimagepolicy_schema.py, written from upstream's CRD); against the rules the
policy-controller's validating webhook adds (restated from upstream's Go validation); and for
coverage: every image the overlays run in a namespace that opts in is matched by a policy, with
the glob semantics upstream documents (`*` any run of non-`/` characters, `**` anything, the
image's fully qualified name: `docker.io/x` is `index.docker.io/x`). The llmslo image is verified with a
key (the kind `make image-verify` signs and checks with on a real registry), and nothing claims a release
workflow that does not exist.
"""

from __future__ import annotations

import copy
import re

import jsonschema
import pytest

from tests.deploy.clusterimagepolicy_schema import API_VERSION, cluster_image_policy_schema
from tests.deploy.conftest import ROOT

INCLUDE = "policy.sigstore.dev/include"
IMAGE_KEY = {"name": "llmslo-image-key", "key": {"secretRef": {"name": "llmslo-image-key"}}}
MODES = ("enforce", "warn")
GLOB_CHARS = re.compile(r"^[a-zA-Z0-9\-_:/*.@]+$")


@pytest.fixture(scope="module")
def schema() -> dict:
    return cluster_image_policy_schema()


def schema_errors(schema: dict, obj: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]


def webhook_errors(obj: dict) -> list[str]:
    """What policy-controller's own admission would refuse (clusterimagepolicy_validation.go)."""
    spec, errors = obj["spec"], []
    if not spec.get("images"):
        errors.append("images: missing")
    for i, image in enumerate(spec.get("images", [])):
        if not image.get("glob") or not GLOB_CHARS.match(image["glob"]):
            errors.append(f"images[{i}].glob: invalid {image.get('glob')!r}")
    if spec.get("mode", "enforce") not in MODES:
        errors.append(f"mode: unsupported {spec['mode']!r}")
    if not spec.get("authorities"):
        errors.append("authorities: missing (the controller can be told to refuse this)")
    for i, authority in enumerate(spec.get("authorities", [])):
        at = f"authorities[{i}]"
        kinds = [k for k in ("key", "keyless", "static") if k in authority]
        if len(kinds) != 1:
            errors.append(f"{at}: exactly one of key, keyless, static (has {kinds})")
        key = authority.get("key")
        if key is not None:
            sources = [k for k in ("data", "kms", "secretRef") if key.get(k)]
            if len(sources) != 1:
                errors.append(f"{at}.key: exactly one of data, kms, secretRef (has {sources})")
            if "namespace" in key.get("secretRef", {}):
                errors.append(f"{at}.key.secretRef.namespace: must be left to the controller's own namespace")
        keyless = authority.get("keyless")
        if keyless is not None:
            if ("url" in keyless) == ("ca-cert" in keyless):
                errors.append(f"{at}.keyless: exactly one of url, ca-cert")
            if not keyless.get("identities"):
                errors.append(f"{at}.keyless.identities: missing")
            for j, identity in enumerate(keyless.get("identities", [])):
                for field in ("issuer", "subject"):
                    present = [k for k in (field, field + "RegExp") if identity.get(k)]
                    if len(present) != 1:
                        errors.append(f"{at}.keyless.identities[{j}]: exactly one of {field}, {field}RegExp")
                    if identity.get(field + "RegExp"):
                        try:
                            re.compile(identity[field + "RegExp"])
                        except re.error as e:
                            errors.append(f"{at}.keyless.identities[{j}].{field}RegExp: {e}")
    return errors


def glob_regex(glob: str) -> re.Pattern:
    """A ClusterImagePolicy glob as the policy-controller documents it: `**` anything, `*` no `/`."""
    if glob == "*":
        glob = "index.docker.io/library/*"
    elif glob == "*/*":
        glob = "index.docker.io/*/*"
    out = re.escape(glob).replace(r"\*\*", "\0").replace(r"\*", "[^/]*").replace("\0", ".*")
    return re.compile(f"^{out}$")


def qualified(image: str) -> str:
    """The fully qualified name a glob is matched against (Docker Hub's host and library/ made explicit)."""
    first, _, rest = image.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        image, first, rest = f"index.docker.io/{image}", "index.docker.io", image
    if first == "docker.io":
        image = f"index.docker.io/{rest}"
    host, _, path = image.partition("/")
    if host == "index.docker.io" and "/" not in path.split("@")[0].split(":")[0]:
        image = f"{host}/library/{path}"
    return image


def policies_matching(policies: list[dict], image: str) -> list[str]:
    name = qualified(image)
    return [p["metadata"]["name"] for p in policies
            if any(glob_regex(i["glob"]).match(name) or glob_regex(i["glob"]).match(image) for i in p["spec"]["images"])]


def cips(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] == "ClusterImagePolicy"]


def test_cluster_image_policies_validate_against_the_crd(built, schema):
    for name, objects in built.items():
        found = cips(objects)
        assert {p["metadata"]["name"] for p in found} == {"llmslo-exporter-image", "llmslo-serving-images"}, name
        for policy in found:
            assert policy["apiVersion"] == API_VERSION
            assert schema_errors(schema, policy) == [], (name, policy["metadata"]["name"])
            assert webhook_errors(policy) == [], (name, policy["metadata"]["name"])
            assert "namespace" not in policy["metadata"]  # cluster-scoped


def test_the_checks_have_teeth(built, schema):
    good = cips(built["production"])[0]
    typo = copy.deepcopy(good)
    typo["spec"]["authorities"][0]["kee"] = typo["spec"]["authorities"][0].pop("key")
    assert any("kee" in e for e in schema_errors(schema, typo))
    assert any("exactly one of key, keyless, static" in e for e in webhook_errors(typo))
    two_sources = copy.deepcopy(good)
    two_sources["spec"]["authorities"][0]["key"]["data"] = "-----BEGIN PUBLIC KEY-----"
    assert any("exactly one of data, kms, secretRef" in e for e in webhook_errors(two_sources))
    elsewhere = copy.deepcopy(good)
    elsewhere["spec"]["authorities"][0]["key"]["secretRef"]["namespace"] = "default"
    assert any("controller's own namespace" in e for e in webhook_errors(elsewhere))
    no_subject = copy.deepcopy(good)  # the keyless rules, on an authority none of ours uses
    no_subject["spec"]["authorities"][0] = {"name": "k", "keyless": {
        "url": "https://fulcio.example", "identities": [{"issuer": "https://issuer.example"}]}}
    assert schema_errors(schema, no_subject) == []
    assert any("subject, subjectRegExp" in e for e in webhook_errors(no_subject))
    bad = copy.deepcopy(good)
    bad["spec"]["mode"] = "audit"
    bad["spec"]["images"] = [{"glob": "ghcr.io/llmslo/(llmslo)"}]
    assert len(webhook_errors(bad)) == 2
    wrong_version = {**good, "apiVersion": "policy.sigstore.dev/v1"}
    assert schema_errors(schema, wrong_version)


def test_globs_follow_upstream_semantics():
    assert qualified("busybox:latest") == "index.docker.io/library/busybox:latest"
    assert qualified("docker.io/vllm/vllm-openai@sha256:ab") == "index.docker.io/vllm/vllm-openai@sha256:ab"
    assert qualified("ghcr.io/llmslo/llmslo@sha256:ab") == "ghcr.io/llmslo/llmslo@sha256:ab"
    assert glob_regex("ghcr.io/llmslo/llmslo@**").match("ghcr.io/llmslo/llmslo@sha256:" + "0" * 64)
    assert not glob_regex("ghcr.io/llmslo/llmslo@**").match("ghcr.io/llmslo/llmslo-evil@sha256:00")
    assert not glob_regex("ghcr.io/*").match("ghcr.io/llmslo/llmslo:v1")
    assert glob_regex("**").match("index.docker.io/library/busybox:latest")


def test_every_image_in_an_opted_in_namespace_needs_a_signature(built):
    for name, objects in built.items():
        policies = cips(objects)
        included = {o["metadata"]["name"] for o in objects
                    if o["kind"] == "Namespace" and o["metadata"].get("labels", {}).get(INCLUDE) == "true"}
        # the inference namespace; the exporter runs in the monitoring namespace, which the install neither creates
        # nor labels (it belongs to the Prometheus stack): its image is matched all the same, wherever it runs
        assert included == {"llm"}, name
        images = {}
        for o in objects:
            if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
                spec = o["spec"]["template"]["spec"]
                for c in spec["containers"] + spec.get("initContainers", []):
                    images[c["image"]] = o["metadata"]["namespace"]
        engines = {image: ns for image, ns in images.items() if ns != "monitoring"}
        assert images and set(engines.values()) <= included, (name, images)
        for image in list(images) + ["busybox:latest"]:  # and what `kubectl debug` would add
            assert "llmslo-serving-images" in policies_matching(policies, image), (name, image)
        exporter = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
        assert policies_matching(policies, exporter["image"]) == ["llmslo-exporter-image", "llmslo-serving-images"]


def test_the_llmslo_image_is_verified_with_its_key(built):
    for name, objects in built.items():
        policies = {p["metadata"]["name"]: p for p in cips(objects)}
        # Exactly the key authority: a sigstore public key in a Secret, no transparency log required (skopeo's
        # signatures, like `make image-verify`'s, have no Rekor entry), no certificate identity.
        assert policies["llmslo-exporter-image"]["spec"]["authorities"] == [IMAGE_KEY], name
        # The same key admits the llmslo image under the serving-images policy; engines need the platform key.
        serving = policies["llmslo-serving-images"]["spec"]["authorities"]
        assert IMAGE_KEY in serving, name
        assert [a["key"] for a in serving if a["name"] != IMAGE_KEY["name"]] == \
            [{"secretRef": {"name": "llmslo-serving-images-key"}}], name
        assert not [a for p in policies.values() for a in p["spec"]["authorities"] if "keyless" in a], name


RELEASE_WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
# What the keyless release signing claimed: a workflow, its OIDC identity, Fulcio.
RELEASE_CLAIMS = ("release workflow", "workflows/release.yml", "token.actions.githubusercontent.com",
                  "fulcio.sigstore.dev", "GitHub's OIDC", "id-token: write")


def test_no_file_claims_a_release_workflow_that_does_not_exist():
    if RELEASE_WORKFLOW.exists():
        pytest.skip(f"{RELEASE_WORKFLOW.relative_to(ROOT)} exists: the claims may be true")
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "slogen" / "kustomize").rglob("*.yaml")]
    found = [f"{path.relative_to(ROOT)}: {claim!r}" for path in files for claim in RELEASE_CLAIMS
             if claim.lower() in path.read_text().lower()]
    assert found == []
    text = (ROOT / "slogen" / "kustomize" / "policy" / "image-signatures.yaml").read_text()
    assert "make image-verify" in text and "keyless" not in text.lower()


def test_signatures_are_enforced_in_production_and_warned_in_dev(built):
    assert {p["spec"]["mode"] for p in cips(built["production"])} == {"enforce"}
    assert {p["spec"]["mode"] for p in cips(built["dev"])} == {"warn"}
