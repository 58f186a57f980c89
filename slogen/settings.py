"""The install's settings (`llmslo.yaml`): where things go and what they carry, written once.

Why a file: a namespace or an object label is one fact that many objects carry (the PrometheusRules, the
dashboards' ConfigMaps, the AlertmanagerConfig, the exporter, every kustomization of the install). `slogen
init` writes it, `slogen build` reads it beside the SLO directory, and a flag given on the command line must
agree with it: a flag that disagrees is refused with both values named, never silently preferred.

    version: llmslo/install/v1
    namespace: monitoring              # the exporter, rules, dashboard ConfigMaps, AlertmanagerConfig
    inferenceNamespaces: [llm]         # the engines, their taps and ScaledObjects
    objectLabels: {release: kps}       # on every object of the install
    floor: "off"                       # off | audit | enforce: the serving security floor
    image: ghcr.io/llmslo/llmslo@sha256:<64 hex>
    apiServerCIDR: 10.0.0.0/16         # the exporter's egress for discovery
    receivers: {llmslo-page: https://...}
    runbookUrl: https://wiki.example.org/runbooks/{{alert}}
    grafanaUrl: https://grafana.example.org
    promtoolTests: true                # write the generated promtool tests (alerts/*.test.yaml, dashboards/)
    isolation: {pool: inference}       # the inference pool kept apart (slogen.poolisolation)
    tapInjector: false                 # the webhook that adds the tap to the pods that opt in (needs cert-manager)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slogen import poolisolation
from slogen.errors import SpecError, SpecErrors, load_mapping_file
from slogen.k8smeta import MANAGED_LABEL_KEYS, label_problems, namespace_problem, webhook_url_problem
from slogen.poolisolation import Isolation

VERSION = "llmslo/install/v1"
DEFAULT_NAME = "llmslo.yaml"
DEFAULT_NAMESPACE = "monitoring"
DEFAULT_API_SERVER_CIDR = "0.0.0.0/0"
FLOORS = ("off", "audit", "enforce")
IMAGE_NAME = "ghcr.io/llmslo/llmslo"  # the name the shipped manifests use; `image` replaces it
ZERO_DIGEST = "sha256:" + "0" * 64
_IMAGE = re.compile(r"^(?P<name>[a-z0-9][-a-z0-9._:/]*[a-z0-9])@(?P<digest>sha256:[0-9a-f]{64})$")
_CIDR = re.compile(r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$|^[0-9a-fA-F:]+/\d{1,3}$")
# the file's keys -> the field and the flag that set them
KEYS = {"namespace": ("namespace", "--namespace"), "inferenceNamespaces": ("inference_namespaces", "--inference-namespace"),
        "objectLabels": ("object_labels", "--object-label"), "floor": ("floor", "--floor"),
        "image": ("image", "--image"), "apiServerCIDR": ("api_server_cidr", "--api-server-cidr"),
        "receivers": ("receivers", "--receiver"), "runbookUrl": ("runbook_url", "--runbook-url"),
        "grafanaUrl": ("grafana_url", "--grafana-url")}
# the file's keys that no flag sets -> their field: what `slogen build` writes, a choice of the repository
FILE_KEYS = {"promtoolTests": "promtool_tests", "tapInjector": "tap_injector"}
MAPPING_FILE_KEYS = {poolisolation.KEY: "isolation"}  # a mapping no flag sets, read by its own module


@dataclass(frozen=True)
class InstallSettings:
    """The install's settings. `path` is the file they were read from (None: flags and defaults only)."""

    namespace: str = DEFAULT_NAMESPACE
    inference_namespaces: tuple[str, ...] = ()
    object_labels: Mapping[str, str] = field(default_factory=dict)
    floor: str = "off"
    image: str = ""  # name@sha256:digest; empty: the shipped name with the placeholder digest (refused by init)
    api_server_cidr: str = DEFAULT_API_SERVER_CIDR
    receivers: Mapping[str, str] = field(default_factory=dict)
    runbook_url: str = ""  # a template with {{alert}}: every alert's runbook link (empty: the build's default)
    grafana_url: str = ""  # every alert's dashboard link (empty: the build's default)
    # write the generated promtool test files; a repository that runs them from a build in its CI (as this one
    # does, in its test suite) need not commit them
    promtool_tests: bool = True
    # the tap injector (slogen/kustomize/tap-injector) in the install; off by default: its certificate needs
    # cert-manager (or the one-time steps docs/deploy.md gives), which not every cluster has
    tap_injector: bool = False
    # the inference pool and its serving pods (its servingNamespaces resolved against inference_namespaces);
    # None: no isolation alerts
    isolation: Isolation | None = None
    path: Path | None = None

    @property
    def image_name(self) -> str:
        return self.image.partition("@")[0] if self.image else IMAGE_NAME

    @property
    def image_digest(self) -> str:
        return self.image.partition("@")[2] if self.image else ZERO_DIGEST


def problems(s: InstallSettings) -> list[tuple[str, str]]:
    """(flag, why) of each value Kubernetes, the image reference or Alertmanager would refuse."""
    out = []
    for flag, names in (("--namespace", [s.namespace]), ("--inference-namespace", s.inference_namespaces)):
        out += [(flag, f"{n!r} {why}") for n in names if (why := namespace_problem(n))]
    if len(set(s.inference_namespaces)) != len(s.inference_namespaces):
        out.append(("--inference-namespace", f"{', '.join(s.inference_namespaces)} names a namespace twice"))
    out += [("--object-label", f"{kv}: {why}") for kv, why in label_problems(s.object_labels)]
    out += [("--object-label", f"{k}={v}: the install sets {k} itself; choose another key")
            for k, v in s.object_labels.items() if k in MANAGED_LABEL_KEYS]
    if s.floor not in FLOORS:
        out.append(("--floor", f"{s.floor!r} is not one of {', '.join(FLOORS)}"))
    if s.image and not _IMAGE.match(s.image):
        out.append(("--image", f"{s.image!r}: write REGISTRY/NAME@sha256:<64 hex digits> (a digest, not a tag: a tag "
                               "can be moved to other bytes after review)"))
    if s.image.endswith(ZERO_DIGEST):
        out.append(("--image", "the all-zero digest is a placeholder, not an image: give the digest you pushed "
                               "(`make release` writes it to dist/)"))
    if not _CIDR.match(s.api_server_cidr):
        out.append(("--api-server-cidr", f"{s.api_server_cidr!r} is not a CIDR, e.g. 10.0.0.0/16"))
    out += [("--receiver", f"{name}={url}: the URL {why}")
            for name, url in s.receivers.items() if (why := webhook_url_problem(url))]
    return out


def pairs(flag: str, given: Sequence[str]) -> dict[str, str]:
    """KEY=VALUE flags as a dict; the same key twice with two values is refused, naming both."""
    out: dict[str, str] = {}
    for pair in given:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError(flag, f"{pair!r} is not KEY=VALUE", fix=f"write e.g. {flag} release=kube-prometheus-stack")
        if key in out and out[key] != value:
            raise SpecError(flag, f"{key} is given twice, as {key}={out[key]} and {key}={value}", fix="give it once")
        out[key] = value
    return out


def _mapping(file: str, key: str, value: Any, errors: list[SpecError]) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                              for v in value.values()):
        errors.append(SpecError(file, "expected a mapping of names to text", key, fix=f"write {key}: {{name: value}}"))
        return {}
    return {str(k): str(v) for k, v in value.items()}


def load(path: Path) -> InstallSettings:
    """The settings file; SpecErrors naming the file, the field and the fix for anything wrong in it."""
    file = str(path)
    doc = load_mapping_file(path, "settings file", "run `slogen init` or pass an existing file to --settings",
                            f"version: {VERSION}")
    errors: list[SpecError] = []
    if doc.get("version") != VERSION:
        errors.append(SpecError(file, f"version is {doc.get('version')!r}", "version", fix=f"write version: {VERSION}"))
    values: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "version" or key in MAPPING_FILE_KEYS:
            continue
        if key in FILE_KEYS:
            if isinstance(value, bool):
                values[FILE_KEYS[key]] = value
            else:
                errors.append(SpecError(file, f"expected true or false, got {value!r}", key, fix=f"write {key}: false"))
            continue
        if key not in KEYS:
            errors.append(SpecError(file, f"unknown key {key!r}", str(key),
                                    fix=f"use one of {', '.join([*KEYS, *FILE_KEYS, *MAPPING_FILE_KEYS])}"))
            continue
        name = KEYS[key][0]
        if key in ("objectLabels", "receivers"):
            values[name] = _mapping(file, key, value or {}, errors)
        elif key == "inferenceNamespaces":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                errors.append(SpecError(file, "expected a list of namespace names", key, fix=f"write {key}: [llm]"))
            else:
                values[name] = tuple(value)
        elif key == "floor" and value is False:  # YAML 1.1 reads a bare `off` as false
            values[name] = "off"
        elif not isinstance(value, str):
            errors.append(SpecError(file, f"expected text, got {value!r}", key, fix=f"write {key}: \"...\""))
        else:
            values[name] = value
    if poolisolation.KEY in doc:
        values["isolation"] = poolisolation.read(file, doc[poolisolation.KEY], values.get("inference_namespaces", ()), errors)
    settings = InstallSettings(path=path, **values)
    errors += [SpecError(file, why, _key(flag), fix="change the value in the file") for flag, why in problems(settings)]
    if errors:
        raise SpecErrors(errors)
    return settings


def _key(flag: str) -> str:
    return next(key for key, (_, f) in KEYS.items() if f == flag)


def merge(base: InstallSettings, flags: Mapping[str, Any]) -> InstallSettings:
    """`base` (the file's settings, or the defaults) with the flags given on top. A flag that disagrees with
    the file is a SpecError naming both values: one fact has one place, and neither silently wins."""
    where = str(base.path) if base.path else None
    changes: dict[str, Any] = {}
    for key, (name, flag) in KEYS.items():
        given = flags.get(name)
        if given in (None, (), {}, ""):
            continue
        current = getattr(base, name)
        if isinstance(current, Mapping):
            for k, v in given.items():
                if where and k in current and current[k] != v:
                    raise SpecError(flag, f"{k}={v} conflicts with {key}.{k}={current[k]} in {where}",
                                    fix=f"change one of them: the file is where the install's {key} live")
            changes[name] = {**current, **given}
        elif where and key in _file_keys(base) and current != given:
            raise SpecError(flag, f"{_show(given)} conflicts with {key}: {_show(current)} in {where}",
                            fix=f"drop the flag or change {key} in {where}")
        else:
            changes[name] = tuple(given) if isinstance(current, tuple) else given
    return replace(base, **changes)


def _file_keys(s: InstallSettings) -> set[str]:
    """The keys the file set (those whose value is not the default)."""
    default = InstallSettings()
    return {key for key, (name, _) in KEYS.items() if getattr(s, name) != getattr(default, name)}


def _show(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


def path_for(inputs: Sequence[str | Path], given: str | None) -> Path | None:
    """`--settings FILE` when given; else llmslo.yaml beside the first input directory when it exists."""
    if given:
        return Path(given)
    from slogen.pools import input_root

    default = input_root(inputs) / DEFAULT_NAME
    return default if default.exists() else None


def render(s: InstallSettings) -> str:
    """The settings as the file `slogen init` writes (with a comment per key)."""
    labels = "".join(f"\n  {k}: {_quote(v)}" for k, v in sorted(s.object_labels.items())) or " {}"
    receivers = "".join(f"\n  {k}: {_quote(v)}" for k, v in sorted(s.receivers.items())) or " {}"
    inference = "".join(f"\n  - {n}" for n in s.inference_namespaces) or " []"
    return f"""\
# The install's settings, read by `slogen build` (and written by `slogen init`). Each value is written once
# here and carried by every object the build and `kubectl kustomize deploy` make; a flag given to
# `slogen build` must agree with it (docs/deploy.md).
version: {VERSION}
# The exporter, the PrometheusRules, the dashboards' ConfigMaps and the AlertmanagerConfig.
namespace: {s.namespace}
# The engines' namespaces: their taps' SLO ConfigMap, the exporter's discovery Role, the ScaledObjects.
inferenceNamespaces:{inference}
# Labels on every object, e.g. release: <your kube-prometheus-stack release> (its selectors' label).
objectLabels:{labels}
# The serving security floor: "off" (nothing enforced), "audit" (warnings and audit events only),
# "enforce" (Pod Security restricted, the admission policy denying, signed images required).
floor: "{s.floor}"
# The exporter's image, by digest.
image: {s.image or IMAGE_NAME + '@' + ZERO_DIGEST}
# The API server's endpoints (`kubectl get endpoints kubernetes -n default`): the exporter's discovery egress.
apiServerCIDR: {s.api_server_cidr}
# Alertmanager receivers and their webhook URLs: llmslo-page, llmslo-ticket, and one per spec `team` label.
receivers:{receivers}
# Where on call lands from an alert: the runbook link (a template, {{{{alert}}}} is the alert's name; the
# runbooks are written to docs/runbooks/) and Grafana (the dashboards' links).
runbookUrl: "{s.runbook_url}"
grafanaUrl: "{s.grafana_url}"
# Write the generated promtool tests (alerts/*.test.yaml, dashboards/dashboards.test.yaml), which the CI
# workflow runs; false leaves them out of the build (and of `slogen build --check`).
promtoolTests: {"true" if s.promtool_tests else "false"}
# The tap injector: a webhook adding the goodput tap to the pods labelled llmslo.io/tap: enabled (docs/deploy.md,
# "The tap injected"); its certificate comes from cert-manager.
tapInjector: {"true" if s.tap_injector else "false"}
{poolisolation.render(s.isolation)}"""


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
